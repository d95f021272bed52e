"""The [actor.lora] sub-table: parsed, checked key by key, written back, overridable."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import UserError
from rlctl.profile.dump import profile_to_toml
from rlctl.profile.loader import load_profile

REPO = Path(__file__).resolve().parents[2]


def test_shipped_lora_profile_extends_the_full_fine_tune():
    p = load_profile(REPO / "profiles/smollm2-lora-cpu.toml")
    full = load_profile(REPO / "profiles/smollm2-cpu.toml")
    assert p.actor.lora is not None and full.actor.lora is None
    assert (p.actor.lora.rank, p.actor.lora.alpha, p.actor.lora.target_modules) == (16, 32.0, ["all-linear"])
    assert p.actor.lora.export_merged is True
    assert p.data == full.data and p.rollout == full.rollout and p.actor.lr == 10 * full.actor.lr


def test_dump_round_trips(tmp_path):
    for name in ("smollm2-lora-cpu.toml", "smollm2-cpu.toml"):
        p = load_profile(REPO / "profiles" / name)
        again = tmp_path / name
        again.write_text(profile_to_toml(p))
        assert load_profile(again).actor == p.actor


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[actor.lora]\nrnk = 4\n", "unknown key 'actor.lora.rnk' (did you mean 'actor.lora.rank'?)"),
        ("[actor.lora]\nrank = 0\n", "actor.lora.rank: expected >= 1, got integer 0"),
        ("[actor.lora]\ndropout = 1.0\n", "actor.lora.dropout: expected >= 0 and < 1"),
        ("[actor.lora]\ntarget_modules = \"q_proj\"\n", "actor.lora.target_modules: expected a list"),
        ("[actor]\nlora = 16\n", "actor.lora: expected a table [actor.lora], got integer 16"),
    ],
)
def test_bad_lora_keys_name_file_key_and_value(tmp_path, body, message):
    path = tmp_path / "p.toml"
    path.write_text(body)
    with pytest.raises(UserError) as err:
        load_profile(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_set_creates_the_table(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[model]\npath = "m"\n')
    p = load_profile(path, ["actor.lora.rank=8", "actor.lora.target_modules=['q_proj','v_proj']"])
    assert p.actor.lora.rank == 8 and p.actor.lora.target_modules == ["q_proj", "v_proj"]
    assert load_profile(path).actor.lora is None


def _model_dir(tmp_path: Path, tie: bool) -> Path:
    d = tmp_path / ("tied" if tie else "untied")
    d.mkdir()
    (d / "config.json").write_text(f'{{"model_type": "qwen2", "tie_word_embeddings": {str(tie).lower()}}}')
    return d


@pytest.mark.parametrize(
    ("tie", "lora", "key", "why"),
    [
        (False, "dropout = 0.05", "actor.lora.dropout", "PPO's clipping would act on dropout noise"),
        (False, "target_modules = ['q_proj', 'embed_tokens']", "actor.lora.target_modules", "embedding layer"),
        (True, "modules_to_save = ['lm_head']", "actor.lora.modules_to_save", "tied input/output embedding"),
        (True, "modules_to_save = ['embed_tokens']", "actor.lora.modules_to_save", "tied input/output embedding"),
    ],
)
def test_lora_settings_that_cannot_be_exact_are_refused_at_profile_check(tmp_path, tie, lora, key, why):
    path = tmp_path / "p.toml"
    path.write_text(f'[model]\npath = "{_model_dir(tmp_path, tie)}"\n[actor.lora]\n{lora}\n')
    with pytest.raises(UserError) as err:
        load_profile(path)
    assert str(err.value).startswith(f"{path}: {key}: ") and why in str(err.value)


def test_saving_lm_head_of_an_untied_model_passes_the_check(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(f'[model]\npath = "{_model_dir(tmp_path, False)}"\n[actor.lora]\nmodules_to_save = ["lm_head"]\n')
    assert load_profile(path).actor.lora.modules_to_save == ["lm_head"]
