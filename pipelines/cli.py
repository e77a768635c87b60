"""The ``elmo`` command: one sub-command per stage, each the same command as its ``python -m``.

Each stage's ``cli.py`` imports its stage only when the command runs, so ``elmo prepare`` never
pays for the torch, MLflow and Ray imports of the others and ``elmo --help`` for none
(benchmarks/results/cli_startup-2026-11-27.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, cast, get_args

import typer

from pipelines.adapt.cli import adapt_command
from pipelines.analyze.cli import analyze_command
from pipelines.common.cli_runner import command_app, run_command, run_commands
from pipelines.common.handoff import HandOn
from pipelines.embed.cli import embed_command
from pipelines.evaluate.cli import evaluate_command
from pipelines.prepare.cli import prepare_command
from pipelines.registry.cli import import_weights_command, promote_command, register_command
from pipelines.train.cli import Trained, train_command


def train_and_register(
    *,
    hand_on: Annotated[
        str,
        typer.Option(
            help="the model evaluate and register get: best (lowest validation perplexity; the "
            "final one when no validation ran) or final"
        ),
    ] = "best",
    no_register: Annotated[
        bool, typer.Option("--no-register", help="skip evaluate+register")
    ] = False,
    **options: Any,
) -> None:
    """Pretrain a biLM on Ray Train; evaluate and register its best (or final) model."""
    if hand_on not in get_args(HandOn):
        raise typer.BadParameter(f"{hand_on!r} is not best or final", param_hint="--hand-on")
    trained = train_command(**options)
    if not no_register:
        evaluate_and_register(trained, cast(HandOn, hand_on))


# typer reads a command's options from its signature and annotations: train's, then these two
_OPTIONS = [
    *inspect.signature(train_command, eval_str=True).parameters.values(),
    *list(inspect.signature(train_and_register, eval_str=True).parameters.values())[:2],
]
train_and_register.__signature__ = inspect.Signature(_OPTIONS)  # type: ignore[attr-defined]
train_and_register.__annotations__ = {option.name: option.annotation for option in _OPTIONS}


def evaluate_and_register(trained: Trained, hand_on: HandOn) -> None:
    """The evaluate and register stages on a trained run's handed-on model, as the flow runs
    them, each saying what it did."""
    from pipelines.evaluate.stage import evaluate_trained
    from pipelines.registry.register import register_trained

    result, data, parent_run_id = trained
    handed = result.handed_on(hand_on)
    typer.echo(f"evaluating and registering {handed.description}: {handed.model_dir}")
    scores = evaluate_trained(result, data, hand_on=hand_on, parent_run_id=parent_run_id)
    typer.echo(
        f"heldout perplexity {scores.perplexity:.2f} (forward {scores.forward_perplexity:.2f}, "
        f"backward {scores.backward_perplexity:.2f}) over all {scores.num_tokens:,} heldout "
        "tokens predicted (each sentence's words and its end)"
    )
    registered = register_trained(
        result, data, scores, hand_on=hand_on, parent_run_id=parent_run_id
    )
    verb = "registered" if registered.newly_registered else "already registered as"
    decision = "" if registered.decision is None else f" ({registered.decision.reason})"
    typer.echo(f"{verb} {registered.uri}, alias {registered.alias}{decision}")


STAGES: dict[str, Callable[..., None]] = {
    "prepare": prepare_command,
    "train": train_and_register,
    "evaluate": evaluate_command,
    "register": register_command,
    "promote": promote_command,
    "import-weights": import_weights_command,
    "adapt": adapt_command,
    "analyze": analyze_command,
    "embed": embed_command,
}

app = command_app(
    STAGES,
    name="elmo",
    no_args_is_help=True,
    help="Pretrain and adapt ELMo: prepare → train → evaluate → register → adapt.",
)


def main(argv: list[str] | None = None) -> int:
    return run_commands(app, argv, prog_name="elmo")


def train_main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.train``: the same command as ``elmo train``."""
    return run_command(train_and_register, argv)


def console_main() -> None:
    """The ``elmo`` console script."""
    raise SystemExit(main())


if __name__ == "__main__":
    console_main()
