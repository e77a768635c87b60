"""Read and write the original bilm-tf release format: ``options.json`` plus an HDF5 of weights.

Every difference between that layout (docs/architecture.md, "bilm-tf weight files") and our
modules is handled here and nowhere else: the 261-row char table, TF's row-vector kernels, the
LSTM's joint ``W_0`` in gate order (i, j, f, o) and its bias without the +1 forget offset.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from pydantic import ValidationError

from elmo_core.config import ModelConfig
from elmo_core.errors import ConfigError, WeightsError
from elmo_core.location import atomic_write
from elmo_core.model.bilm import BiLM
from elmo_core.model.elmo import Elmo
from elmo_core.model.lstm.reference import ProjectedLSTM, ProjectedLSTMLayer
from elmo_core.text.char_ids import MAX_CHARS_PER_TOKEN, NUM_CHARACTERS

# bilm-tf option (dotted) → our ModelConfig field (dotted); one table for both directions.
OPTION_FIELDS = {
    "lstm.dim": "lstm.cell_dim",
    "lstm.projection_dim": "lstm.projection_dim",
    "lstm.n_layers": "lstm.num_layers",
    "lstm.cell_clip": "lstm.cell_clip",
    "lstm.proj_clip": "lstm.proj_clip",
    "lstm.use_skip_connections": "lstm.use_skip_connections",
    "char_cnn.activation": "char_cnn.activation",
    "char_cnn.embedding.dim": "char_cnn.embedding_dim",
    "char_cnn.filters": "char_cnn.filters",
    "char_cnn.max_characters_per_token": "char_cnn.max_chars_per_token",
    "char_cnn.n_characters": "char_cnn.num_characters",
    "char_cnn.n_highway": "char_cnn.num_highway",
    "dropout": "dropout",
    "n_negative_samples_batch": "num_samples",
}
# What bilm-tf's inference graph assumes when an optional key is absent.
_TF_DEFAULTS: dict[str, Any] = {
    "lstm.n_layers": 1,
    "lstm.cell_clip": None,
    "lstm.proj_clip": None,
    "char_cnn.n_highway": 0,
}
# Options that only the training recipe reads (bin/train_elmo.py); they do not change the network.
_RECIPE_KEYS = {
    "all_clip_norm_val",
    "batch_size",
    "n_epochs",
    "n_train_tokens",
    "unroll_steps",
    "sample_softmax",
    "share_embedding_softmax",
}
_STORED_CHARACTERS = NUM_CHARACTERS - 1  # bilm-tf's training table has no padding row
_FORGET_BIAS = 1.0  # added by TF's LSTMCell at run time, absent from the stored B
SOFTMAX_WEIGHT, SOFTMAX_BIAS = "softmax/W", "softmax/b"


def read_bilm_tf(
    options_file: str | Path,
    weight_file: str | Path,
    stateful: bool = False,
    softmax_file: str | Path | None = None,
) -> BiLM:
    """A BiLM holding the weights of a bilm-tf release; with ``softmax_file``, its softmax too.

    Returned in eval mode, as bilm-tf's inference graph runs (no dropout); ``.train()`` it to
    keep training. ``stateful`` carries each row's LSTM states across calls, as bilm-tf did.
    """
    config, vocab_size = read_options(options_file)
    softmax = _read_softmax(softmax_file, config, vocab_size) if softmax_file else None
    bilm = BiLM(config, None if softmax is None else softmax[0].shape[0], stateful=stateful)
    with _open_weights(weight_file) as weights, torch.no_grad():
        _check_layout(weights, bilm, weight_file)
        for dataset in _datasets(bilm):
            dataset.assign(_read_dataset(weights, dataset, weight_file))
        if not _has_stored_projection(bilm):
            bilm.token_encoder.projection.weight.copy_(torch.eye(config.lstm.projection_dim))
            bilm.token_encoder.projection.bias.zero_()
        if bilm.softmax is not None and softmax is not None:
            bilm.softmax.weight.copy_(torch.from_numpy(softmax[0]))
            bilm.softmax.bias.copy_(torch.from_numpy(softmax[1]))
    return bilm.eval()


def elmo_from_bilm_tf(
    options_file: str | Path,
    weight_file: str | Path,
    num_output_representations: int,
    **kwargs: Any,
) -> Elmo:
    """ELMo over released bilm-tf weights (``options.json`` + HDF5); kwargs go to ``Elmo``."""
    return Elmo(read_bilm_tf(options_file, weight_file), num_output_representations, **kwargs)


def write_bilm_tf(
    bilm: BiLM,
    options_file: str | Path,
    weight_file: str | Path,
    softmax_file: str | Path | None = None,
) -> None:
    """Write ``bilm`` as bilm-tf would (options + HDF5); each file appears whole or not at all.

    bilm-tf's HDF5 has no softmax: ``softmax_file`` is one of our own (``softmax/W (V, P)``,
    ``softmax/b (V)``). Reading back gives the same weights bit for bit, except the forget bias
    offset's float32 arithmetic (within one ulp of ``max(1, |b|)``).
    """
    if softmax_file is not None and bilm.softmax is None:
        raise WeightsError("this biLM has no softmax to save", path=softmax_file)
    projection = bilm.token_encoder.projection
    if not _has_stored_projection(bilm) and not (
        torch.equal(projection.weight, torch.eye(projection.out_features).to(projection.weight))
        and not projection.bias.any()
    ):
        raise WeightsError(
            "bilm-tf stores no CNN_proj when the filters number projection_dim; this biLM's "
            "projection is not the identity",
            path=weight_file,
        )
    for path in (options_file, weight_file, softmax_file):
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    options = config_to_options(bilm.config, bilm.vocab_size)
    arrays = {dataset.name: dataset.export() for dataset in _datasets(bilm)}
    atomic_write(Path(weight_file), lambda path: _write_hdf5(path, arrays))
    if softmax_file is not None and bilm.softmax is not None:
        softmax = {
            SOFTMAX_WEIGHT: _numpy(bilm.softmax.weight),
            SOFTMAX_BIAS: _numpy(bilm.softmax.bias),
        }
        atomic_write(Path(softmax_file), lambda path: _write_hdf5(path, softmax))
    text = json.dumps(options, indent=2)
    atomic_write(Path(options_file), lambda path: path.write_text(text))


def read_options(options_file: str | Path) -> tuple[ModelConfig, int | None]:
    """``options.json`` → our config and the vocabulary size (``n_tokens_vocab``) if recorded."""
    source = str(options_file)
    try:
        options = json.loads(Path(options_file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("options file not found", source=source) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"not a JSON options file: {err}", source=source) from None
    if not isinstance(options, dict):
        raise ConfigError("the options must be a JSON object", source=source)
    vocab_size = options.get("n_tokens_vocab")
    if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size < 2):
        raise ConfigError(
            f"must be an integer ≥ 2, got {vocab_size!r}", key="n_tokens_vocab", source=source
        )
    return options_to_config(options, source), vocab_size


def options_to_config(options: dict[str, Any], source: str | None = None) -> ModelConfig:
    """bilm-tf options → ModelConfig; unknown keys and values raise ConfigError naming the key."""
    values = dict(_TF_DEFAULTS)
    for key, value in _flatten(options):
        if key in OPTION_FIELDS:
            values[key] = value
        elif key == "bidirectional" and value is not True:
            raise ConfigError("only bidirectional models are supported", key=key, source=source)
        elif key not in _RECIPE_KEYS | {"bidirectional", "n_tokens_vocab"}:
            raise ConfigError("unknown bilm-tf option", key=key, source=source)
    missing = sorted(set(OPTION_FIELDS) - set(values) - {"dropout", "n_negative_samples_batch"})
    if missing:
        raise ConfigError("required bilm-tf option is missing", key=missing[0], source=source)
    _check_fixed_values(values, source)
    values["char_cnn.n_characters"] = NUM_CHARACTERS
    values["char_cnn.n_highway"] = values["char_cnn.n_highway"] or 0
    ours: dict[str, Any] = {}
    for key, value in values.items():
        _set_dotted(ours, OPTION_FIELDS[key], value)
    try:
        return ModelConfig.model_validate(ours)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"][:2])
        key = next((tf for tf, mine in OPTION_FIELDS.items() if mine == field), field)
        raise ConfigError(first["msg"], key=key, source=source) from None


def config_to_options(config: ModelConfig, vocab_size: int | None = None) -> dict[str, Any]:
    """ModelConfig → bilm-tf options, ``n_characters`` 262 as in the released files."""
    ours = dict(_flatten(config.model_dump(mode="json")))
    options: dict[str, Any] = {"bidirectional": True}
    for key, field in OPTION_FIELDS.items():
        _set_dotted(options, key, ours[field])
    if vocab_size is not None:
        options["n_tokens_vocab"] = vocab_size
    return options


def _check_fixed_values(values: dict[str, Any], source: str | None) -> None:
    """Values our char-id scheme and LSTM fix, which bilm-tf allowed to vary."""
    if values["char_cnn.n_characters"] not in (_STORED_CHARACTERS, NUM_CHARACTERS):
        raise ConfigError(
            f"must be {_STORED_CHARACTERS} or {NUM_CHARACTERS} (the byte-level character table), "
            f"got {values['char_cnn.n_characters']!r}",
            key="char_cnn.n_characters",
            source=source,
        )
    if values["char_cnn.max_characters_per_token"] != MAX_CHARS_PER_TOKEN:
        raise ConfigError(
            f"must be {MAX_CHARS_PER_TOKEN}, got {values['char_cnn.max_characters_per_token']!r}",
            key="char_cnn.max_characters_per_token",
            source=source,
        )
    dim, projection = values["lstm.dim"], values["lstm.projection_dim"]
    if isinstance(dim, int) and isinstance(projection, int) and projection >= dim:
        raise ConfigError(
            f"must be below lstm.dim ({dim}): bilm-tf builds no LSTM projection otherwise, "
            f"got {projection}",
            key="lstm.projection_dim",
            source=source,
        )


@dataclass(frozen=True)
class _Dataset:
    """One HDF5 dataset: how to export our parameters into it and assign it back to them."""

    name: str
    export: Callable[[], np.ndarray]
    assign: Callable[[np.ndarray], None]


def _datasets(bilm: BiLM) -> list[_Dataset]:
    """Every dataset of the bilm-tf layout for ``bilm``'s configuration, in file order."""
    encoder = bilm.token_encoder
    embedding = encoder.char_embedding.weight  # (262, E)
    found = [
        _Dataset("char_embed", lambda: _numpy(embedding)[1:], lambda a: _copy(embedding, _pad(a)))
    ]
    for index, conv in enumerate(encoder.convolutions):
        assert isinstance(conv, torch.nn.Conv1d) and conv.bias is not None
        found.append(_mapped(f"CNN/W_cnn_{index}", conv.weight, _conv_to_tf, _conv_from_tf))
        found.append(_mapped(f"CNN/b_cnn_{index}", conv.bias))
    highway = encoder.highway
    for index, (transform, carry) in enumerate(zip(highway.transform, highway.carry, strict=True)):
        assert isinstance(transform, torch.nn.Linear) and isinstance(carry, torch.nn.Linear)
        prefix = f"CNN_high_{index}"
        found.append(_mapped(f"{prefix}/W_carry", carry.weight, _transpose, _transpose))
        found.append(_mapped(f"{prefix}/b_carry", carry.bias))
        found.append(_mapped(f"{prefix}/W_transform", transform.weight, _transpose, _transpose))
        found.append(_mapped(f"{prefix}/b_transform", transform.bias))
    if _has_stored_projection(bilm):
        found.append(_mapped("CNN_proj/W_proj", encoder.projection.weight, _transpose, _transpose))
        found.append(_mapped("CNN_proj/b_proj", encoder.projection.bias))
    for direction, lstm in enumerate((bilm.forward_lstm, bilm.backward_lstm)):
        found.extend(_lstm_datasets(direction, lstm))
    return found


def _has_stored_projection(bilm: BiLM) -> bool:
    """bilm-tf projects the token vectors only when the filters do not number projection_dim."""
    projection = bilm.token_encoder.projection
    return projection.in_features != projection.out_features


def _lstm_datasets(direction: int, lstm: ProjectedLSTM) -> Iterator[_Dataset]:
    for index, layer in enumerate(lstm.layers):
        assert isinstance(layer, ProjectedLSTMLayer)
        prefix = f"RNN_{direction}/RNN/MultiRNNCell/Cell{index}/LSTMCell"
        yield _Dataset(f"{prefix}/W_0", _kernel_exporter(layer), _kernel_assigner(layer))
        yield _mapped(f"{prefix}/B", layer.bias, _bias_to_tf, _bias_from_tf)
        yield _mapped(f"{prefix}/W_P_0", layer.projection_weight, _transpose, _transpose)


def _forget_offset(bias: np.ndarray) -> np.ndarray:
    """``(4H,)`` zeros with TF's run-time forget bias on our forget slice (order i, f, g, o)."""
    offset = np.zeros_like(bias)
    cell_dim = bias.shape[0] // 4
    offset[cell_dim : 2 * cell_dim] = _FORGET_BIAS
    return offset


def _bias_to_tf(bias: np.ndarray) -> np.ndarray:
    return _swap_gates(bias - _forget_offset(bias))  # effective -> stored, (i, j, f, o)


def _bias_from_tf(stored: np.ndarray) -> np.ndarray:
    bias = _swap_gates(stored)  # (i, f, g, o)
    return bias + _forget_offset(bias)


def _kernel_exporter(layer: ProjectedLSTMLayer) -> Callable[[], np.ndarray]:
    def export() -> np.ndarray:
        joint = np.concatenate(
            [_numpy(layer.input_weight), _numpy(layer.recurrent_weight)], axis=1
        )  # (4H, I + P)
        return np.ascontiguousarray(_swap_gates(joint).T)  # (I + P, 4H), TF gate order

    return export


def _kernel_assigner(layer: ProjectedLSTMLayer) -> Callable[[np.ndarray], None]:
    def assign(kernel: np.ndarray) -> None:
        joint = _swap_gates(kernel.T)  # (4H, I + P), our gate order
        input_dim = layer.input_weight.shape[1]
        _copy(layer.input_weight, joint[:, :input_dim])
        _copy(layer.recurrent_weight, joint[:, input_dim:])

    return assign


def _mapped(
    name: str,
    parameter: torch.Tensor,
    to_file: Callable[[np.ndarray], np.ndarray] | None = None,
    from_file: Callable[[np.ndarray], np.ndarray] | None = None,
) -> _Dataset:
    """A dataset of one parameter; the conversions default to "same layout"."""
    export, restore = to_file or _same, from_file or _same
    return _Dataset(
        name,
        lambda: np.ascontiguousarray(export(_numpy(parameter))),
        lambda a: _copy(parameter, restore(a)),
    )


def _swap_gates(values: np.ndarray) -> np.ndarray:
    """Blocks (i, j, f, o) ↔ (i, f, g, o) along axis 0: swapping the middle two is self-inverse."""
    i, second, third, o = np.split(values, 4, axis=0)
    return np.concatenate([i, third, second, o], axis=0)


def _conv_to_tf(weight: np.ndarray) -> np.ndarray:
    return weight.transpose(2, 1, 0)[np.newaxis]  # (n, E, w) -> (1, w, E, n)


def _conv_from_tf(kernel: np.ndarray) -> np.ndarray:
    return kernel[0].transpose(2, 1, 0)  # (1, w, E, n) -> (n, E, w)


def _same(values: np.ndarray) -> np.ndarray:
    return values


def _transpose(values: np.ndarray) -> np.ndarray:
    return values.T


def _pad(table: np.ndarray) -> np.ndarray:
    """The stored 261-row char table with our zero padding row in front."""
    return np.concatenate([np.zeros_like(table[:1]), table], axis=0)


def _numpy(parameter: torch.Tensor) -> np.ndarray:
    return parameter.detach().cpu().numpy()


def _copy(parameter: torch.Tensor, values: np.ndarray) -> None:
    parameter.copy_(torch.from_numpy(np.ascontiguousarray(values)))


@contextmanager
def _open_weights(path: str | Path) -> Iterator[h5py.File]:
    """``h5py.File`` for reading; a missing or non-HDF5 file is a WeightsError."""
    if not Path(path).is_file():
        raise WeightsError("weight file not found", path=path)
    try:
        weights = h5py.File(path, "r")
    except OSError as err:
        raise WeightsError(f"not an HDF5 weight file ({err})", path=path) from None
    with weights:
        yield weights


def _check_layout(weights: h5py.File, bilm: BiLM, path: str | Path) -> None:
    """Refuse files of another layout, and files holding layers the options do not describe."""
    if "char_embed" not in weights and "RNN_0" not in weights:
        found = ", ".join(sorted(weights.keys())[:8]) or "nothing"
        raise WeightsError(
            f"not a bilm-tf weight file: expected 'char_embed', 'CNN/...', 'RNN_0/...' at the top "
            f"level, found {found}",
            path=path,
        )
    expected = {dataset.name for dataset in _datasets(bilm)}
    stored: list[str] = []
    weights.visititems(
        lambda name, item: stored.append(name) if isinstance(item, h5py.Dataset) else None
    )
    extra = [name for name in stored if name.startswith(("CNN", "RNN_")) and name not in expected]
    if extra:
        raise WeightsError(
            f"datasets the options do not describe (check n_highway, n_layers, filters): "
            f"{', '.join(sorted(extra)[:5])}",
            path=path,
        )


def _read_dataset(weights: h5py.File, dataset: _Dataset, path: str | Path) -> np.ndarray:
    item = weights.get(dataset.name)
    if not isinstance(item, h5py.Dataset):
        raise WeightsError(f"dataset '{dataset.name}' is missing", path=path)
    expected = dataset.export().shape
    if item.shape != expected:
        raise WeightsError(
            f"dataset '{dataset.name}' has shape {tuple(item.shape)} in the file, the options "
            f"imply {tuple(expected)}",
            path=path,
        )
    return np.asarray(item[...], dtype=np.float32)


def _read_softmax(
    path: str | Path, config: ModelConfig, vocab_size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """``softmax/W (V, P)`` and ``softmax/b (V)``, checked against the options."""
    with _open_weights(path) as weights:
        arrays = []
        for name in (SOFTMAX_WEIGHT, SOFTMAX_BIAS):
            item = weights.get(name)
            if not isinstance(item, h5py.Dataset):
                raise WeightsError(f"dataset '{name}' is missing (not a softmax file?)", path=path)
            arrays.append(np.asarray(item[...], dtype=np.float32))
    weight, bias = arrays
    rows = vocab_size if vocab_size is not None else weight.shape[0] if weight.ndim else 0
    for name, array, expected in (
        (SOFTMAX_WEIGHT, weight, (rows, config.lstm.projection_dim)),
        (SOFTMAX_BIAS, bias, (rows,)),
    ):
        if array.shape != expected:
            raise WeightsError(
                f"dataset '{name}' has shape {array.shape} in the file, expected {expected} "
                f"(projection_dim and n_tokens_vocab of the options)",
                path=path,
            )
    return weight, bias


def _write_hdf5(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with h5py.File(path, "w") as out:
        for name, values in arrays.items():
            out.create_dataset(name, data=values.astype(np.float32, copy=False))


def _flatten(mapping: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Leaves of nested dicts as ``(dotted.key, value)``."""
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _set_dotted(target: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        target = target.setdefault(part, {})
    target[leaf] = value
