"""The champion/challenger policy against a real MLflow SQLite store.

One store per module (creating its tables costs seconds). The first versions are real tiny biLMs
registered by ``register`` (which applies the policy); the edge cases add versions of the same
logged model under their own model names, tagged as ``register`` tags them, so each case starts
from a registry it controls.
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mlflow import MlflowClient

from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.perplexity import Protocol
from elmo_core.presets import tiny
from pipelines import cli
from pipelines.evaluate.result import EvaluationResult
from pipelines.registry import policy
from pipelines.registry import register as reg
from pipelines.tracking import stage_runs

pytestmark = pytest.mark.integration

VOCAB_SHA = "vocabulary-a"  # what the added versions record; "other-vocabulary" differs


def _evaluation(
    perplexity: float, heldout_hash: str = "heldout-a", protocol: Protocol = "batched"
) -> EvaluationResult:
    """An evaluation of 1000 heldout tokens with the geometric mean ``perplexity``."""
    return EvaluationResult(
        forward_perplexity=perplexity * 0.98,
        backward_perplexity=perplexity * 1.02,
        perplexity=perplexity,
        num_tokens=1000,
        split="heldout",
        files=None,
        protocol=protocol,
        heldout_hash=heldout_hash,
    )


@pytest.fixture(scope="module")
def registry(tmp_path_factory, isolated_home, registry_dataset):
    """``elmo-bilm`` registered four times: perplexity 41, 31, 35, then without evaluation."""
    root = tmp_path_factory.mktemp("registry-policy")
    with isolated_home(root):
        torch.manual_seed(0)
        model_dir = write_bilm_dir(BiLM(tiny(), 100), root / "bilm")
        dataset = str(registry_dataset(root / "dataset"))
        results = [
            reg.register(model_dir, dataset, evaluation=evaluation, hdf5_export=False)
            for evaluation in (_evaluation(41.0), _evaluation(31.0), _evaluation(35.0), None)
        ]
        client = MlflowClient(stage_runs.use_tracking())
        source = client.get_model_version("elmo-bilm", "1")
        yield SimpleNamespace(client=client, results=results, source=source)


def _add_version(
    registry, name: str, evaluation: EvaluationResult | None, vocab_sha: str = VOCAB_SHA
):
    """A new version of ``name`` (the same logged biLM), tagged as register tags it."""
    files = reg.DatasetFiles("test", None, Path("manifest.json"), vocab_sha, "-")
    tags = reg.model_version_tags(evaluation, files)
    if not registry.client.search_registered_models(f"name = '{name}'"):
        registry.client.create_registered_model(name)
    created = registry.client.create_model_version(
        name, registry.source.source, run_id=registry.source.run_id, tags=tags
    )
    return int(created.version)


def _tags(registry, name: str, version: int) -> dict[str, str]:
    return registry.client.get_model_version(name, str(version)).tags


def _holder(registry, name: str, alias: str) -> int:
    return int(registry.client.get_model_version_by_alias(name, alias).version)


def test_register_crowns_a_better_perplexity_and_marks_the_old_champion_superseded(registry):
    aliases = [result.alias for result in registry.results]
    assert aliases == ["champion", "champion", "challenger", "challenger"]
    assert _holder(registry, "elmo-bilm", "champion") == 2
    first, second = _tags(registry, "elmo-bilm", 1), _tags(registry, "elmo-bilm", 2)
    assert first[policy.REASON_TAG].startswith("first champion")
    assert first[policy.SUPERSEDED_BY_TAG] == "2"
    assert second[policy.REASON_TAG] == "heldout perplexity 31 beats champion v1's 41"
    assert policy.SUPERSEDED_BY_TAG not in second


def test_worse_perplexity_and_missing_perplexity_become_challenger(registry):
    assert "does not beat champion v2's 31" in _tags(registry, "elmo-bilm", 3)[policy.REASON_TAG]
    assert "no heldout perplexity" in _tags(registry, "elmo-bilm", 4)[policy.REASON_TAG]
    assert _holder(registry, "elmo-bilm", "challenger") == 4  # the latest challenger holds it
    assert _holder(registry, "elmo-bilm", "champion") == 2


def test_first_version_without_perplexity_is_not_made_champion(registry):
    version = _add_version(registry, "no-perplexity", None)
    decision = policy.apply_champion_policy("no-perplexity", version, registry.client)
    assert (decision.alias, decision.previous_champion) == ("challenger", None)
    assert policy.current_champion("no-perplexity", registry.client) is None


@pytest.mark.parametrize(
    ("evaluation", "vocab_sha", "differs"),
    [
        (_evaluation(10.0, heldout_hash="heldout-b"), VOCAB_SHA, "heldout data"),
        (_evaluation(10.0), "other-vocabulary", "vocabulary"),
        (_evaluation(10.0, protocol="original"), VOCAB_SHA, "evaluation protocol"),
    ],
    ids=["heldout", "vocabulary", "protocol"],
)
def test_better_perplexity_on_other_data_is_challenger_with_the_reason(
    registry, evaluation, vocab_sha, differs
):
    name = f"incomparable-{differs.replace(' ', '-')}"
    champion = _add_version(registry, name, _evaluation(40.0))
    policy.apply_champion_policy(name, champion, registry.client)
    version = _add_version(registry, name, evaluation, vocab_sha)
    decision = policy.apply_champion_policy(name, version, registry.client)
    assert (decision.alias, decision.previous_champion) == ("challenger", champion)
    assert decision.reason.startswith(f"not comparable: {differs} differs from champion v1")
    assert _tags(registry, name, version)[policy.REASON_TAG] == decision.reason
    assert _holder(registry, name, "champion") == champion


def test_tie_keeps_the_champion_and_reapplying_changes_nothing(registry):
    champion = _add_version(registry, "tie", _evaluation(30.0))
    policy.apply_champion_policy("tie", champion, registry.client)
    tied = _add_version(registry, "tie", _evaluation(30.0))
    decision = policy.apply_champion_policy("tie", tied, registry.client)
    assert decision.alias == "challenger" and "ties champion v1's 30" in decision.reason
    again = policy.apply_champion_policy("tie", champion, registry.client)
    assert (again.alias, again.reason) == ("champion", "already champion")
    assert _tags(registry, "tie", champion)[policy.REASON_TAG].startswith("first champion")


def test_explicit_promotion_crowns_a_version_without_perplexity_until_the_next_one(registry):
    measured = _add_version(registry, "explicit", _evaluation(30.0))
    policy.apply_champion_policy("explicit", measured, registry.client)
    imported = _add_version(registry, "explicit", None)
    assert policy.apply_champion_policy("explicit", imported, registry.client).alias == "challenger"
    assert policy.promote("explicit", imported, client=registry.client) == measured
    assert _holder(registry, "explicit", "champion") == imported
    assert _tags(registry, "explicit", imported)[policy.REASON_TAG] == "promoted explicitly"
    assert _tags(registry, "explicit", measured)[policy.SUPERSEDED_BY_TAG] == str(imported)
    assert int(policy.current_champion("explicit", registry.client).version) == imported
    assert not [v for v in _versions(registry, "explicit") if "challenger" in v.aliases]
    # A champion chosen by hand has no perplexity to beat: nothing measured replaces it.
    later = _add_version(registry, "explicit", _evaluation(5.0))
    decision = policy.apply_champion_policy("explicit", later, registry.client)
    assert decision.alias == "challenger" and "has no heldout perplexity" in decision.reason
    assert policy.promote("explicit", later, alias="staging", client=registry.client) is None
    assert _holder(registry, "explicit", "staging") == later


def _versions(registry, name: str):
    return registry.client.search_model_versions(f"name = '{name}'")


def test_promote_command_sets_the_alias_and_refuses_unknown_versions(registry, capsys):
    assert cli.main(["promote", "--name", "elmo-bilm", "--version", "3"]) == 0
    assert "models:/elmo-bilm@champion → version 3 (was version 2)" in capsys.readouterr().out
    assert _holder(registry, "elmo-bilm", "champion") == 3
    assert _tags(registry, "elmo-bilm", 2)[policy.SUPERSEDED_BY_TAG] == "3"
    assert cli.main(["promote", "--name", "elmo-bilm", "--version", "99"]) == 2
    assert "cannot promote" in capsys.readouterr().err
    assert cli.main(["promote", "--version", "1", "--alias", "v1"]) == 2
    assert "reserved" in capsys.readouterr().err
