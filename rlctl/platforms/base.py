"""The ``Platform`` contract every vendor plugin (built-in or out-of-tree) implements.

A platform answers, for one host: is my hardware here (``probe``), which collective backend,
Ray resource, torch device and visible-devices variables to use, the environment for the
rollout engine, which attention kernel and rollout engine to pick (each with the reason it was
or wasn't chosen), which dtypes work and which version pins apply. Probes never import torch,
Ray or vendor libraries in this process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlctl.platforms.bounded import call_bounded, probe_timeout
from rlctl.platforms.host import Host
from rlctl.platforms.pins import Facts, Pin, load_pin_file, load_pins
from rlctl.platforms.runtime_spec import RuntimeSpec
from rlctl.verdict import Check

# rollout engine -> distributions it needs installed
ENGINE_DISTS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "hf": ("transformers",),
}


@dataclass(frozen=True)
class ProbeResult:
    """Whether the platform's hardware is on this host, why, and what was read on the way."""

    found: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Resolution:
    """Which platform, at which tier (explicit | env | plugin | builtin | fallback), and why."""

    name: str
    tier: str
    reason: str
    probes: dict[str, ProbeResult] = field(default_factory=dict)
    plugin_errors: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tier": self.tier,
            "reason": self.reason,
            "probes": {k: {"found": v.found, "reason": v.reason} for k, v in self.probes.items()},
            "plugin_errors": dict(self.plugin_errors),
        }


@dataclass(frozen=True)
class Candidate:
    """One option (attention kernel, rollout engine) and why it was or wasn't chosen."""

    name: str
    chosen: bool
    reason: str


@dataclass(frozen=True)
class EngineSettings:
    """What one engine is told on this platform: the kernel it runs (``None``: the engine's own
    choice), the constructor keywords that select it, the environment its processes need, and the
    source (file and version of the engine's code) the setting was read from."""

    engine: str
    kernel: str | None
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "kernel": self.kernel,
            "engine_kwargs": dict(self.engine_kwargs),
            "env": dict(self.env),
            "reason": self.reason,
            "source": self.source,
        }


def choose(options: list[tuple[str, bool, str]]) -> list[Candidate]:
    """Mark the first usable option as chosen; the others say why not (or that one came first)."""
    out: list[Candidate] = []
    picked: str | None = None
    for name, usable, reason in options:
        if usable and picked is None:
            picked = name
            out.append(Candidate(name, True, reason))
        elif usable:
            out.append(Candidate(name, False, f"usable, but {picked} comes first ({reason})"))
        else:
            out.append(Candidate(name, False, reason))
    return out


class Platform:
    """Base of all platforms. Subclasses set the class attributes and implement ``_probe``."""

    name: ClassVar[str] = "base"
    dist_backend: ClassVar[str] = "gloo"
    ray_resource: ClassVar[str] = "CPU"
    device_type: ClassVar[str] = "cpu"
    torch_flavours: ClassVar[tuple[str, ...]] = ("cpu",)  # torch builds that work here
    torch_module: ClassVar[str | None] = None  # imported before torch knows the device (torch_npu)
    engine_order: ClassVar[tuple[str, ...]] = ("hf",)
    engine_dists: ClassVar[dict[str, tuple[str, ...]]] = ENGINE_DISTS
    # engines that exist but do not run on this platform in rlctl -> why (cited)
    unsupported_engines: ClassVar[dict[str, str]] = {}
    # a vendor's own pin data: a pins TOML file beside its module (built-ins keep theirs in pins.toml)
    pin_data: ClassVar[str | None] = None
    # what doctor tells the user, in the vendor's words (None: doctor's generic advice)
    torch_install: ClassVar[str | None] = None  # how to install the torch build this platform needs
    driver_fix: ClassVar[str | None] = None  # how to get the devices seen (driver, device files)
    smi_tool: ClassVar[str | None] = None  # the management tool whose answers the probe reads
    # the vendor's own distributions doctor reports (a version row each): the libraries its probe
    # or Ray reads the devices through, then its extensions of torch and the engines
    # (distribution -> module), whose requirements doctor checks and which ``--deep`` imports
    tool_dists: ClassVar[tuple[str, ...]] = ()
    stack_dists: ClassVar[dict[str, str]] = {}
    # base distribution -> the vendor's extension installed after it, whose own pins replace the
    # base's (doctor does not hold the base to its requirements on what the extension pins)
    overrides: ClassVar[dict[str, str]] = {}

    def __init__(self, host: Host | None = None) -> None:
        self.host = host if host is not None else Host()
        self.resolution: Resolution | None = None  # set by resolve_platform: why it was chosen
        self._probe_result: ProbeResult | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # ------------------------------------------------------------ probing
    def probe(self, refresh: bool = False) -> ProbeResult:
        """Cheap, safe detection; cached. Bounded in time (``RLCTL_PROBE_TIMEOUT_S``, 30 s) and
        isolated from ``sys.exit``: a hang, an exit or any exception becomes ``found=False``."""
        if self._probe_result is None or refresh:
            try:
                result = call_bounded(self._probe, probe_timeout(self.host.env), f"{self.name} probe")
                if not isinstance(result, ProbeResult):
                    raise TypeError(f"_probe returned {type(result).__name__}, not a ProbeResult")
                self._probe_result = result
            except Exception as exc:
                self._probe_result = ProbeResult(False, f"probe crashed: {type(exc).__name__}: {exc}")
        return self._probe_result

    def _probe(self) -> ProbeResult:
        raise NotImplementedError

    # ------------------------------------------------------------ devices and env
    @property
    def visible_devices_env(self) -> str | None:
        """Variable that restricts which devices a process sees (None on CPU)."""
        return None

    @property
    def ray_noset_env(self) -> str | None:
        """Ray's RAY_EXPERIMENTAL_NOSET_* variable that stops Ray setting the one above."""
        return None

    def runtime_spec(self) -> RuntimeSpec:
        """The devices as the runtime half (:mod:`rlctl.devices`) needs them: plain, picklable data
        a worker process receives instead of this platform."""
        return RuntimeSpec(
            self.device_type,
            self.dist_backend,
            self.ray_resource,
            self.visible_devices_env,
            self.torch_module,
            self.ray_noset_env,
        )

    def vendor_env(self) -> dict[str, str]:
        """Variables rlctl sets for the worker processes on this platform when the user has not."""
        return {}

    def rollout_env(self) -> dict[str, str]:
        """The worker processes' vendor variables: rlctl's default for each of :meth:`vendor_env`,
        or the user's own value when it is already set (passed on so every Ray node sees it)."""
        return {k: self.host.env.get(k, v) for k, v in self.vendor_env().items()}

    def env_sources(self) -> dict[str, dict[str, str]]:
        """Which vendor variables rlctl sets (``rlctl_sets``) and which it found set (``user_set``)."""
        sets: dict[str, str] = {}
        found: dict[str, str] = {}
        for k, v in self.vendor_env().items():
            if k in self.host.env:
                found[k] = self.host.env[k]
            else:
                sets[k] = v
        return {"rlctl_sets": sets, "user_set": found}

    def device_count(self) -> int:
        """Devices seen by the probe (0 when not found; 1 for CPU)."""
        return len(self.probe().details.get("devices", []))

    def collective_world(self) -> int:
        """How many ranks doctor's collective test runs: one a device, at most two (0: none to run)."""
        return min(2, self.device_count())

    # ------------------------------------------------------------ kernels and engines
    def attention_candidates(self) -> list[Candidate]:
        """Ordered transformers attention implementations, first usable one chosen."""
        return choose([("sdpa", True, "torch SDPA"), ("eager", True, "always available")])

    def attention_impl(self) -> str:
        """The chosen transformers ``attn_implementation``."""
        for c in self.attention_candidates():
            if c.chosen:
                return c.name
        return "eager"

    def engine_settings(self, engine: str) -> EngineSettings:
        """The kernel setting ``engine`` (``hf`` | ``fsdp`` | ``vllm`` | ``sglang``) accepts on this
        platform. The transformers engines (training, HF rollout) take :meth:`attention_impl`;
        an external engine is left to its own choice unless a vendor plugin knows better."""
        if engine in ("hf", "fsdp"):
            impl = self.attention_impl()
            return EngineSettings(engine, impl, {"attn_implementation": impl}, reason="platform choice")
        return EngineSettings(engine, None, reason="the engine's own choice")

    def kernel_problem(self, engine: str, engine_kwargs: dict[str, Any]) -> str | None:
        """Why ``engine_kwargs`` ask ``engine`` for a kernel that cannot run on this platform
        (None: nothing known against them). Vendor plugins add what their engines assert."""
        return None

    def all_engine_settings(self) -> dict[str, EngineSettings]:
        """:meth:`engine_settings` for training (``fsdp``) and every rollout engine of this platform."""
        return {name: self.engine_settings(name) for name in ("fsdp", *self.engine_order)}

    def rollout_attention_candidates(self) -> list[Candidate]:
        """vLLM attention backends in preference order (empty where vLLM does not run)."""
        return []

    def engine_install_hint(self, engine: str) -> str:
        """How to install ``engine`` on this platform (one command or one sentence)."""
        if engine == "hf":
            needs = self.engine_dists.get("hf", ("transformers",))
            return "pip install " + " ".join(needs)
        return f"pip install 'rlctl[{engine}]'"

    def rollout_engines(self) -> list[str]:
        """Rollout engines in preference order on this platform."""
        return list(self.engine_order)

    def rollout_engine_candidates(self) -> list[Candidate]:
        """Each rollout engine with whether it is installed; the first installed one is chosen."""
        options = []
        for name in self.engine_order:
            needs = self.engine_dists.get(name, (name,))
            missing = [d for d in needs if self.host.dists.get(d) is None]
            if missing:
                options.append((name, False, f"not installed ({', '.join(missing)} missing)"))
            else:
                versions = ", ".join(f"{d} {self.host.dists.version(d)}" for d in needs)
                options.append((name, True, f"installed ({versions})"))
        return choose(options)

    def installed_rollout_engines(self) -> list[str]:
        """The rollout engines whose distributions are installed, in preference order."""
        return [
            name
            for name in self.engine_order
            if all(self.host.dists.get(d) is not None for d in self.engine_dists.get(name, (name,)))
        ]

    def rollout_engine(self) -> str | None:
        """The engine ``rollout.engine = auto`` runs (None: it would refuse to start)."""
        return self.auto_rollout_engine()[0]

    def supported_dtypes(self) -> list[str]:
        """torch dtype names usable for training/rollout on this platform's devices."""
        return ["float32"]

    def default_dtype(self) -> str:
        """What ``platform.dtype = auto`` computes in: float32 on CPU; on an accelerator bfloat16
        where its devices support it, else float16, else float32 (from :meth:`supported_dtypes`)."""
        if self.device_type == "cpu":
            return "float32"
        supported = self.supported_dtypes()
        return next((d for d in ("bfloat16", "float16") if d in supported), "float32")

    def auto_rollout_engine(self) -> tuple[str | None, str]:
        """What ``rollout.engine = auto`` runs, and why: the first installed engine of
        :attr:`engine_order`, where HF transformers counts only when it is the platform's own
        first choice (CPU). ``(None, reason)`` when none is installed: a run never falls back to
        the slow engine silently (``rollout.engine = "hf"`` asks for it)."""
        wanted = [name for name in self.engine_order if name != "hf"] or ["hf"]
        installed = self.installed_rollout_engines()
        for name in wanted:
            if name in installed:
                needs = self.engine_dists.get(name, (name,))
                return name, "installed (" + ", ".join(
                    f"{d} {self.host.dists.version(d)}" for d in needs
                ) + ")"
        stray = [n for n in self.unsupported_engines if self.host.dists.get(n) is not None]
        not_here = (
            f" ({', '.join(stray)} is installed, but rlctl does not run it on {self.name})" if stray else ""
        )
        return None, (
            f"none of the {self.name} platform's rollout engines ({', '.join(wanted)}) is installed{not_here}; "
            f'{self.engine_install_hint(wanted[0])}, or set rollout.engine = "hf" to use HF transformers'
        )

    # ------------------------------------------------------------ pins
    @property
    def pins(self) -> list[Pin]:
        """The pins that apply to this platform: the shipped ones, then its own :attr:`pin_data`."""
        own = load_pin_file(self.pin_data) if self.pin_data else ()
        return [p for p in (*load_pins(), *own) if p.applies_to(self.name)]

    def facts(self, imports: dict[str, str] | None = None) -> Facts:
        """What pins are evaluated against: installed dists, torch build, env, probe details."""
        return Facts(
            platform=self.name,
            dists=self.host.dists,
            torch=self.host.torch,
            env=self.host.env,
            details=self.probe().details,
            imports=imports,
            python=self.host.python,
        )

    # ------------------------------------------------------------ doctor's vendor checks
    def torch_check(self, build: str) -> Check | None:
        """The vendor's own word on the torch install once its build flavour fits (``build``:
        doctor's one-line description of it); None: nothing more to check."""
        return None

    def driver_check(self, details: dict[str, Any]) -> Check | None:
        """A WARN/FAIL about the driver stack the probe read (``details``); None: it is fine."""
        return None

    def process_line(self, proc: dict[str, Any]) -> str:
        """One process the probe saw holding device memory (``details["processes"]``), as doctor's
        devices-busy row names it."""
        mem = f" ({proc['memory_mb']} MB)" if "memory_mb" in proc else ""
        return f"device {proc.get('device', '?')} pid {proc.get('pid', '?')}{mem}"

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (doctor prints it)."""
        return {
            "name": self.name,
            "dist_backend": self.dist_backend,
            "ray_resource": self.ray_resource,
            "device_type": self.device_type,
            "visible_devices_env": self.visible_devices_env,
            "ray_noset_env": self.ray_noset_env,
            "rollout_env": self.rollout_env(),
            "rollout_env_sources": self.env_sources(),
            "device_count": self.device_count(),
            "attention_impl": self.attention_impl(),
            "attention_candidates": [vars(c) for c in self.attention_candidates()],
            "rollout_attention_candidates": [vars(c) for c in self.rollout_attention_candidates()],
            "engine_settings": {k: v.to_dict() for k, v in self.all_engine_settings().items()},
            "rollout_engines": self.rollout_engines(),
            "rollout_engine_candidates": [vars(c) for c in self.rollout_engine_candidates()],
            "supported_dtypes": self.supported_dtypes(),
        }
