"""Typed configuration: pydantic models that reject unknown keys, and their one resolution path.

Every entry point resolves a config the same way: preset → YAML file → ``--set key=value``
overrides. A misspelt or ill-typed key fails with a :class:`~elmo_core.errors.ConfigError`
naming its dotted path and where the value came from.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from elmo_core.errors import ConfigError

# The released models' char CNN: widths 1..7 with 2048 feature maps in all
# (docs/architecture.md, "Token encoder").
RELEASED_FILTERS = [(1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)]


class NestedError(ValueError):
    """A validator's error in a part of its field that the field's type does not declare (a
    task's ``reader`` options, whose model its format picks): ``loc`` is the path below the
    field, so the error names the whole key."""

    def __init__(self, message: str, loc: Sequence[str | int]) -> None:
        super().__init__(message)
        self.loc = tuple(loc)


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CharCNNConfig(StrictModel):
    """Token encoder sizes (bilm-tf ``char_cnn``): char embedding → convolutions → highway."""

    embedding_dim: int = Field(16, gt=0)
    filters: list[tuple[int, int]] = Field(
        default_factory=lambda: [
            (1, 32),
            (2, 32),
            (3, 64),
            (4, 128),
            (5, 256),
            (6, 512),
            (7, 1024),
        ],
        min_length=1,
        description="(width, number of feature maps) per convolution",
    )
    num_highway: int = Field(2, ge=0)
    max_chars_per_token: int = Field(50, ge=3)
    num_characters: int = Field(262, description="rows of the char table (+1 convention)")
    activation: Literal["relu", "tanh"] = "relu"

    @property
    def num_filters(self) -> int:
        """Width of the concatenated convolution outputs (2048 for the released models)."""
        return sum(num for _, num in self.filters)


class LSTMConfig(StrictModel):
    """Projected LSTM stack sizes and clipping (bilm-tf ``lstm``); one stack per direction."""

    cell_dim: int = Field(4096, gt=0)
    projection_dim: int = Field(512, gt=0)
    num_layers: int = Field(2, gt=0)
    cell_clip: float | None = Field(3.0, gt=0)
    proj_clip: float | None = Field(3.0, gt=0)
    use_skip_connections: bool = True


class ModelConfig(StrictModel):
    """The whole biLM: token encoder, LSTM stacks, dropout and the sampled softmax size."""

    char_cnn: CharCNNConfig = Field(default_factory=CharCNNConfig)
    lstm: LSTMConfig = Field(default_factory=LSTMConfig)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    num_samples: int = Field(8192, gt=0, description="sampled-softmax candidates per step")
    lstm_impl: Literal["auto", "reference", "cudnn", "compiled", "graphed", "fused"] = Field(
        "auto",
        description="LSTM kernel: 'auto' is the device's choice in elmo_core.model.lstm's table "
        "(fused on a CPU; on CUDA graphed, or cudnn where both clips are null and the "
        "directions apart); 'cudnn' "
        "(fused nn.LSTM) needs both clips null; 'compiled' is the reference loop under "
        "torch.compile (clips kept, for GPUs); 'fused' runs each layer as one op with its own "
        "backward (clips kept, a third of the ops); 'graphed' replays fused's ops as CUDA graphs "
        "while training; the parameters are the same either way",
    )
    conv_impl: Literal["per_width", "padded"] = Field(
        "per_width",
        description="char CNN filters: one Conv1d per width, or all widths zero-padded to the "
        "widest and run as one convolution (same features and gradients, half the ops; slower "
        "on CPU); the parameters are the same either way",
    )
    cpu_highway_bf16: bool = Field(
        False,
        description="train the char CNN's highway under bf16 autocast on a CPU with bf16 GEMMs "
        "(avx512_bf16 or AMX; float32 weights and accumulation): a faster CPU step, its "
        "gradients bf16's; off, the CPU trains in float32 as the original; evaluation stays "
        "float32 either way",
    )
    batch_directions: bool = Field(
        False,
        description="run the forward and backward LSTM stacks as one, each GEMM batched over "
        "the two directions (half the kernel launches; for GPUs); with 'reference', "
        "'compiled', 'graphed' or 'fused', not 'cudnn'",
    )

    @model_validator(mode="after")
    def _directions_need_the_layer_loop(self) -> ModelConfig:
        if self.batch_directions and self.lstm_impl == "cudnn":
            raise ValueError(
                "batch_directions runs the reference, compiled, graphed or fused layer loop; the "
                "cuDNN kernel runs one direction at a time"
            )
        return self


CorpusFormat = Literal["1b-benchmark", "text", "tokenized"]

# The languages sacremoses ships Moses' nonbreaking prefixes for (``NonbreakingPrefixes``); any
# other code would silently get the English ones.
MosesLanguage = Literal[
    "as", "bn", "ca", "cs", "de", "el", "en", "es", "et", "fi", "fr", "ga", "gu", "hi", "hu",
    "is", "it", "kn", "lt", "lv", "ml", "mni", "mr", "nl", "or", "pa", "pl", "pt", "ro", "ru",
    "sk", "sl", "sv", "ta", "tdt", "te", "yue", "zh",
]  # fmt: skip


class TokenizerConfig(StrictModel):
    """How format ``text`` is tokenized: Moses with the rules of the corpus's language."""

    lang: MosesLanguage = Field(
        "en",
        description="language code: Moses' tokenization rules and the nonbreaking prefixes "
        "('Mr.', 'z.B.', 'Nr.') that do not end a sentence",
    )


class PrepareConfig(StrictModel):
    """Corpus → Parquet shards: the parameters recorded in the dataset manifest."""

    format: CorpusFormat = Field(
        "text",
        description="text: raw text, Moses sentence splitting and tokenization; tokenized: one "
        "sentence per line, tokens separated by whitespace; 1b-benchmark: the 1B Word "
        "Benchmark's layout (tokenized)",
    )
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    max_vocab: int | None = Field(None, gt=3)
    min_count: int = Field(1, ge=1)
    vocab_file: str | None = None
    workers: int = Field(1, ge=1, description="files worked on at once (processes or Ray tasks)")
    executor: Literal["processes", "ray"] = Field(
        "processes",
        description="processes: on this machine; ray: Ray tasks on RAY_ADDRESS's cluster (or a "
        "local Ray), every node seeing the corpus and output paths; workers=1 there means one "
        "task per CPU of the cluster",
    )
    seed: int = 0
    heldout_fraction: float = Field(0.01, ge=0.0, lt=1.0)
    heldout_files: list[str] = Field(default_factory=list)
    sentences_per_shard: int = Field(200_000, gt=0)
    sentences_per_row_group: int = Field(
        10_000, gt=0, description="Parquet row group size: the unit readers partition on"
    )
    on_invalid_utf8: Literal["replace", "fail"] = "replace"
    max_tokens_per_line: int = Field(1000, gt=0)
    on_long_line: Literal["split", "drop"] = "split"
    sha256: str | None = None

    def dataset_params(self) -> dict[str, Any]:
        """The parameters that decide the dataset's bytes: all but where and how widely it runs."""
        return self.model_dump(mode="json", exclude={"workers", "executor"})

    @model_serializer(mode="wrap")
    def _omit_default_tokenizer(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """English, the default, is left out of the record: datasets prepared before the
        ``tokenizer`` section existed keep their manifest bytes and their identity."""
        dumped: dict[str, Any] = handler(self)
        if self.tokenizer == TokenizerConfig():
            dumped.pop("tokenizer", None)
        return dumped

    @field_validator("tokenizer")
    @classmethod
    def _language_needs_moses(
        cls, tokenizer: TokenizerConfig, info: ValidationInfo
    ) -> TokenizerConfig:
        """Only ``text`` goes through Moses: a language given for tokenized input would be
        silently ignored."""
        corpus_format = info.data.get("format", "text")
        if tokenizer != TokenizerConfig() and corpus_format != "text":
            raise ValueError(
                f"tokenizer.lang applies to format 'text' (Moses) only; format "
                f"'{corpus_format}' is split on whitespace as it is"
            )
        return tokenizer

    @model_validator(mode="after")
    def _vocab_options_exclusive(self) -> PrepareConfig:
        if self.vocab_file and (self.max_vocab is not None or self.min_count != 1):
            raise ValueError("vocab_file excludes max_vocab and min_count")
        return self


class TrainConfig(StrictModel):
    """The training recipe; defaults are bilm-tf's
    (docs/architecture.md, "Loss and optimisation")."""

    epochs: float = Field(10.0, gt=0, description="passes over the manifest's training tokens")
    max_steps: int | None = Field(None, gt=0, description="caps the step count from epochs")
    batch_size: int = Field(128, gt=0, description="independent sentence streams per worker")
    unroll_steps: int = Field(20, gt=0, description="window length T of truncated BPTT")
    lr: float = Field(0.2, gt=0)
    initial_accumulator: float = Field(1.0, gt=0, description="Adagrad's starting accumulator")
    clip_norm: float = Field(10.0, gt=0, description="global gradient-norm clip")
    seed: int = 0
    log_every: int = Field(50, gt=0)
    checkpoint_every: int = Field(1000, gt=0)
    validate_every: int = Field(1000, gt=0)
    validation_sentences: int = Field(2000, gt=0, description="fixed heldout sample size")
    early_stopping_patience: int | None = Field(
        None, gt=0, description="validations without improvement before stopping"
    )
    state_reset: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="fraction of rows, drawn per direction at each window, whose LSTM state "
        "starts from zero instead of the carried one, so the zero state that evaluation and "
        "inference start from stays in the training distribution (0: bilm-tf, which starts from "
        "zero only at step 1)",
    )
    warn_rise: float = Field(
        1.25,
        gt=1,
        description="warn when a direction's validation perplexity passes its best × this",
    )
    warn_parting: float = Field(
        1.5,
        gt=1,
        description="warn when one direction's validation perplexity is the other's × this",
    )
    bf16: bool = Field(True, description="bf16 autocast on GPU (ignored on CPU)")
    shape_buckets: bool = Field(
        False,
        description="pad each step's token types, softmax rows and char width to a few fixed "
        "sizes, so every tensor of the step keeps its shape (a CUDA graph, or a compiled step "
        "without recompiles, replays it); the loss and updates are unchanged",
    )
    capture_step: bool = Field(
        False,
        description="replay each whole training step (forward, backward, clip, Adagrad) as one "
        "CUDA graph per shape bucket, the LSTM's fused ops inside it (fewer host launches); "
        "CUDA and one worker only, with shape_buckets",
    )

    @field_validator("capture_step")
    @classmethod
    def _capture_needs_buckets(cls, capture_step: bool, info: ValidationInfo) -> bool:
        if capture_step and not info.data.get("shape_buckets"):
            raise ValueError("a captured step replays fixed shapes: set shape_buckets=true too")
        return capture_step


ConfigT = TypeVar("ConfigT", bound=BaseModel)


def resolve_config(
    schema: type[ConfigT],
    preset: Mapping[str, Any] | None = None,
    yaml_file: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> ConfigT:
    """Merge preset → YAML → ``dotted.key=value`` overrides and validate against ``schema``."""
    merged: dict[str, Any] = copy.deepcopy(dict(preset or {}))
    origin: dict[str, str] = {key: "preset" for key in _dotted_keys(merged)}
    if yaml_file is not None:
        from_file = _load_yaml_mapping(Path(yaml_file))
        _deep_merge(merged, from_file)
        origin.update({key: str(yaml_file) for key in _dotted_keys(from_file)})
    for override in overrides:
        key, value = parse_override(override)
        _set_dotted(merged, key, value)
        origin[key] = f"override '{override}'"
    try:
        return schema.model_validate(merged)
    except ValidationError as err:
        first = err.errors()[0]
        loc, message = first["loc"], first["msg"]
        nested = first.get("ctx", {}).get("error")
        if isinstance(nested, NestedError):
            loc, message = (*loc, *nested.loc), str(nested)
        key = ".".join(str(part) for part in loc) or "<root>"
        source = _origin_of(key, origin)
        raise ConfigError(message, key=key, source=source) from None


def override_keys(schema: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key an override may set in ``schema``: sections and their fields."""
    keys = []
    for name, field in schema.model_fields.items():
        dotted = f"{prefix}{name}"
        keys.append(dotted)
        nested = [
            arg
            for arg in (field.annotation, *get_args(field.annotation))
            if isinstance(arg, type) and issubclass(arg, BaseModel)
        ]
        if nested:
            keys += override_keys(nested[0], f"{dotted}.")
    return keys


def override_pattern(schema: type[BaseModel]) -> str:
    """A regular expression that ``key=value`` overrides of ``schema`` match, for JSON schemas:
    a form (Prefect's deployment form) can then refuse a misspelt key before a run is created."""
    keys = "|".join(re.escape(key) for key in override_keys(schema))
    return f"^(?:{keys})="


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=value``; the value is read as YAML, so ``3``, ``true``, ``[1, 2]`` keep types."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}' is not of the form dotted.key=value")
    try:
        return key, yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError as err:
        raise ConfigError(f"cannot parse value: {err}", key=key, source="--set") from None


def _load_yaml_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError("config file not found", source=str(path))
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"invalid YAML: {getattr(err, 'problem', err)}", source=where) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError("top level must be a mapping of sections", source=str(path))
    return loaded


def _deep_merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _set_dotted(target: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = target
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"'{part}' is a value, not a section", key=key, source="--set")
        node = child
    node[leaf] = value


def _dotted_keys(mapping: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, Mapping):
            keys.extend(_dotted_keys(value, f"{dotted}."))
    return keys


def _origin_of(key: str, origin: Mapping[str, str]) -> str | None:
    """The source of the longest configured prefix of ``key`` (a list index has no own origin)."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        found = origin.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None
