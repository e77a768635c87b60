"""The registered models' descriptions and architecture tags, without a store."""

from elmo_core.config import LSTMConfig
from elmo_core.presets import original, tiny
from pipelines.common.handoff import CHECKPOINT_STEP_TAG, CHECKPOINT_TAG
from pipelines.registry.model_card import (
    ModelCard,
    architecture_tags,
    bilm_card,
    bilm_version_description,
    example_frame,
)
from pipelines.registry.tags import (
    BACKWARD_PERPLEXITY_TAG,
    DATASET_TAG,
    FORWARD_PERPLEXITY_TAG,
    KIND_TAG,
    PERPLEXITY_TAG,
    PRESET_TAG,
    SIZE_TAG,
)


def test_the_description_shows_the_call_with_the_example_and_the_output_columns():
    card = ModelCard(
        name="elmo-ner",
        summary="a tag for every token",
        uri="models:/elmo-ner/3",
        example={"sentence": 'He said "hi".'},
        outputs="`tokens`, `tags`",
        tags={KIND_TAG: "task"},
    )
    lines = card.markdown().splitlines()
    assert lines[0] == "**elmo-ner**: a tag for every token"
    assert 'model = mlflow.pyfunc.load_model("models:/elmo-ner/3")' in lines
    assert 'model.predict(pd.DataFrame({"sentence": ["He said \\"hi\\"."]}))' in lines
    assert lines[-1] == "Output columns: `tokens`, `tags`."
    assert example_frame(card.example).to_dict("list") == {"sentence": ['He said "hi".']}


def test_the_bilm_card_points_at_the_champion_and_is_kind_bilm():
    card = bilm_card("elmo-bilm")
    assert card.uri == "models:/elmo-bilm@champion" and card.tags == {KIND_TAG: "bilm"}
    assert "`embeddings`" in card.outputs and list(card.example) == ["sentence"]


def test_architecture_tags_name_the_preset_whatever_the_training_settings():
    assert architecture_tags(tiny().model_copy(update={"dropout": 0.5, "num_samples": 8})) == {
        PRESET_TAG: "tiny",
        SIZE_TAG: "2x32_16",
    }
    assert architecture_tags(original()) == {PRESET_TAG: "original", SIZE_TAG: "2x4096_512"}
    wider = tiny().model_copy(update={"lstm": LSTMConfig(cell_dim=64, projection_dim=16)})
    assert architecture_tags(wider) == {PRESET_TAG: "custom", SIZE_TAG: "2x64_16"}


def test_the_version_description_leads_with_what_it_scored_then_where_it_came_from():
    tags = {SIZE_TAG: "2x32_16", PRESET_TAG: "tiny", DATASET_TAG: "s3://data/wiki"}
    assert bilm_version_description(tags) == (
        "No heldout perplexity: 2x32_16 biLM (tiny) on s3://data/wiki."
    )
    tags |= {PERPLEXITY_TAG: "31.0"}
    tags |= {FORWARD_PERPLEXITY_TAG: "30.25", BACKWARD_PERPLEXITY_TAG: "31.754"}
    runs = {"trained": "[train-bilm-1](http://ui/#/runs/abc)"}
    assert bilm_version_description(tags, runs) == (
        "31.00 heldout perplexity (forward 30.25, backward 31.75): 2x32_16 biLM (tiny) on "
        "s3://data/wiki; trained in run [train-bilm-1](http://ui/#/runs/abc)."
    )


def test_the_version_description_says_which_model_of_its_training_run_it_is():
    tags = {SIZE_TAG: "2x32_16", PRESET_TAG: "tiny", DATASET_TAG: "d", CHECKPOINT_TAG: "best"}
    assert bilm_version_description(tags | {CHECKPOINT_STEP_TAG: "2000"}) == (
        "No heldout perplexity: 2x32_16 biLM (tiny) on d; its training run's best model "
        "(step 2000)."
    )
    assert bilm_version_description(tags) == (  # an older run's best model: step unknown
        "No heldout perplexity: 2x32_16 biLM (tiny) on d; its training run's best model."
    )
