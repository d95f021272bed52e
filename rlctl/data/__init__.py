"""Datasets: built-in tasks and verl-schema files, chat templating, prompt batches, SFT view."""

from rlctl.data.batcher import PromptBatch, PromptBatcher, left_pad
from rlctl.data.dataset import PromptDataset, encode_prompt, load_dataset, render_prompt
from rlctl.data.files import read_jsonl, read_parquet, read_rows, write_jsonl, write_parquet
from rlctl.data.schema import validate_row
from rlctl.data.sft import SFTDataset, sft_answer

__all__ = [
    "PromptBatch",
    "PromptBatcher",
    "PromptDataset",
    "SFTDataset",
    "encode_prompt",
    "left_pad",
    "load_dataset",
    "read_jsonl",
    "read_parquet",
    "read_rows",
    "render_prompt",
    "sft_answer",
    "validate_row",
    "write_jsonl",
    "write_parquet",
]
