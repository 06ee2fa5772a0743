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

from jaxrl_llm.data.collate import BucketMode
from jaxrl_llm.data.collate import Padding
from jaxrl_llm.data.collate import bucket_length
from jaxrl_llm.data.collate import collate_kto
from jaxrl_llm.data.collate import collate_preferences
from jaxrl_llm.data.collate import collate_prompts
from jaxrl_llm.data.collate import collate_ranks
from jaxrl_llm.data.collate import collate_sequences
from jaxrl_llm.data.collate import pack_sequences
from jaxrl_llm.data.formats import Format
from jaxrl_llm.data.formats import KTOExample
from jaxrl_llm.data.formats import PreferenceExample
from jaxrl_llm.data.formats import PromptExample
from jaxrl_llm.data.formats import RankExample
from jaxrl_llm.data.formats import SFTExample
from jaxrl_llm.data.formats import is_conversational
from jaxrl_llm.data.formats import parse_example
from jaxrl_llm.data.formats import parse_examples
from jaxrl_llm.data.iterator import BatchIterator
from jaxrl_llm.data.iterator import epoch_order
from jaxrl_llm.data.iterator import make_iterator
from jaxrl_llm.data.pipeline import PreparedData
from jaxrl_llm.data.pipeline import collate_fn_for
from jaxrl_llm.data.pipeline import load_examples
from jaxrl_llm.data.pipeline import prepare_dataset
from jaxrl_llm.data.readers import Record
from jaxrl_llm.data.readers import read_hf
from jaxrl_llm.data.readers import read_jsonl
from jaxrl_llm.data.readers import read_parquet
from jaxrl_llm.data.readers import read_records
from jaxrl_llm.data.tokenize import CharTokenizer
from jaxrl_llm.data.tokenize import LengthPolicy
from jaxrl_llm.data.tokenize import TokenizedPreference
from jaxrl_llm.data.tokenize import TokenizedPrompt
from jaxrl_llm.data.tokenize import TokenizedRank
from jaxrl_llm.data.tokenize import TokenizedSequence
from jaxrl_llm.data.tokenize import apply_length_policy
from jaxrl_llm.data.tokenize import encode_completion
from jaxrl_llm.data.tokenize import encode_prompt
from jaxrl_llm.data.tokenize import sequence_length
from jaxrl_llm.data.tokenize import tokenize_example
from jaxrl_llm.data.tokenize import truncate

__all__ = [
    "BatchIterator",
    "BucketMode",
    "CharTokenizer",
    "Format",
    "KTOExample",
    "LengthPolicy",
    "Padding",
    "PreferenceExample",
    "PreparedData",
    "PromptExample",
    "RankExample",
    "Record",
    "SFTExample",
    "TokenizedPreference",
    "TokenizedPrompt",
    "TokenizedRank",
    "TokenizedSequence",
    "apply_length_policy",
    "bucket_length",
    "collate_fn_for",
    "collate_kto",
    "collate_preferences",
    "collate_prompts",
    "collate_ranks",
    "collate_sequences",
    "encode_completion",
    "encode_prompt",
    "epoch_order",
    "is_conversational",
    "load_examples",
    "make_iterator",
    "pack_sequences",
    "parse_example",
    "parse_examples",
    "prepare_dataset",
    "read_hf",
    "read_jsonl",
    "read_parquet",
    "read_records",
    "sequence_length",
    "tokenize_example",
    "truncate",
]
