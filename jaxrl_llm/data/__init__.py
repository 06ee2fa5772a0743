"""Data layer: readers (JSONL, Parquet, Hugging Face datasets), per-format validation,
chat-template tokenisation, the length policy, padding to buckets, packing, and deterministic
resumable host-sharded iteration.

Token data is batch-major ``[B, T]`` numpy int32; the batch layout every trainer consumes is
documented in :mod:`jaxrl_llm.data.collate`. Typical use::

    data = prepare_dataset("data/arith_prefs/train.jsonl", Format.PREFERENCE, tokenizer,
                           max_len=256, length_policy="truncate")
    it = make_iterator(data.items, batch_size=8, seed=0,
                       collate_fn=collate_fn_for(data.format, padding=Padding(pad_id=2)))
    batch = next(it); state = it.state()   # JSON-serialisable; resume with state=state
"""

from jaxrl_llm.data.collate import (
    BucketMode,
    Padding,
    collate_kto,
    collate_preferences,
    collate_prompts,
    collate_ranks,
    collate_sequences,
    pad_length,
    round_up_length,
)
from jaxrl_llm.data.formats import (
    Format,
    KTOExample,
    PreferenceExample,
    PromptExample,
    RankExample,
    SFTExample,
    StepwiseExample,
    TextExample,
    is_conversational,
    parse_example,
    split_implicit_prompt,
)
from jaxrl_llm.data.iterator import BatchIterator, epoch_order, make_iterator
from jaxrl_llm.data.packing import (
    first_fit,
    pack_preferences,
    pack_rl_batch,
    pack_sequences,
    packing_stats,
)
from jaxrl_llm.data.pipeline import (
    PreparedData,
    collate_fn_for,
    describe_prompt_splits,
    load_examples,
    prepare_dataset,
)
from jaxrl_llm.data.readers import (
    Record,
    read_hf,
    read_hub_dataset,
    read_jsonl,
    read_parquet,
    read_records,
)
from jaxrl_llm.data.tokenize import (
    CharTokenizer,
    LengthPolicy,
    LossOn,
    TokenizedPreference,
    TokenizedPrompt,
    TokenizedRank,
    TokenizedSequence,
    apply_length_policy,
    encode_completion,
    encode_conversation,
    encode_prompt,
    sequence_length,
    tokenize_example,
    truncate,
)

__all__ = [
    "BatchIterator",
    "BucketMode",
    "CharTokenizer",
    "Format",
    "KTOExample",
    "LengthPolicy",
    "LossOn",
    "Padding",
    "PreferenceExample",
    "PreparedData",
    "PromptExample",
    "RankExample",
    "Record",
    "SFTExample",
    "StepwiseExample",
    "TextExample",
    "TokenizedPreference",
    "TokenizedPrompt",
    "TokenizedRank",
    "TokenizedSequence",
    "apply_length_policy",
    "collate_fn_for",
    "collate_kto",
    "collate_preferences",
    "collate_prompts",
    "collate_ranks",
    "collate_sequences",
    "describe_prompt_splits",
    "encode_completion",
    "encode_conversation",
    "encode_prompt",
    "epoch_order",
    "is_conversational",
    "load_examples",
    "make_iterator",
    "first_fit",
    "pack_preferences",
    "pack_rl_batch",
    "pack_sequences",
    "packing_stats",
    "pad_length",
    "parse_example",
    "prepare_dataset",
    "read_hf",
    "read_hub_dataset",
    "read_jsonl",
    "read_parquet",
    "read_records",
    "round_up_length",
    "sequence_length",
    "split_implicit_prompt",
    "tokenize_example",
    "truncate",
]
