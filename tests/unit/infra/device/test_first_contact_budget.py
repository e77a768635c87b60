"""The first-contact call's predicted device time: every stage predicted, boxes and limit kept."""

import pytest


@pytest.fixture
def budget():
    from infra.device import first_contact_budget

    return first_contact_budget


def measured(budget, **changes):
    """What a machine like this one measures, at the device's sizes."""
    launches = {f"original/{variant}/{rows}": 1_500 for variant, rows in budget.COUNTED}
    launches[f"small/{budget.SMALL_VARIANT}/{budget.BF16_ROWS}"] = 4_800
    figures = {
        "install_s": 1.0,
        "start_s": 2.0,
        "build_s": {"original": 2.7, "small": 0.1},
        "parameter_bytes": {"original": 2_000_000_000, "small": 60_000_000},
        "windows_s": 0.06,
        "prepare_s": 1.7,
        "collect_s": 3.3,
        "cuda_tests": 6,
        "launches": launches,
        "flops": {"original": 8.2e8, "small": 2.5e8},
        "triton_s": 10.0,
    }
    return budget.Measured(**(figures | changes))


def test_every_stage_of_the_run_is_predicted_and_fits(budget, tmp_path):
    predicted = budget.predict(measured(budget))
    summary, problems = budget.verdict(predicted)

    names = [stage.name for stage in budget.stages(tmp_path, rehearse=False)]
    assert list(summary["stages"]) == names
    assert set(predicted) == {"install", *names}
    assert problems == []
    assert summary["total_s"] < budget.LIMIT_S


def test_each_stage_is_predicted_by_the_model_refit_to_the_last_call_and_shown_beside_it(
    budget,
):
    model = budget.predict(measured(budget))
    summary, _ = budget.verdict(model)

    correctness = summary["stages"]["correctness"]
    assert correctness["model_s"] == pytest.approx(model["correctness"], abs=0.05)
    unmodelled = budget.MEASURED_S["correctness"] - budget.MODEL_THEN_S["correctness"]  # 33.7 s
    assert correctness["predicted_s"] == pytest.approx(model["correctness"] + unmodelled, abs=0.05)
    assert correctness["measured_s"] == 94.5
    for name, stage in summary["stages"].items():  # each beside its record, where it has one
        assert stage["measured_s"] == budget.MEASURED_S.get(name)


def test_every_box_leaves_half_again_the_last_measured_time(budget, tmp_path):
    for stage in budget.stages(tmp_path, rehearse=False):
        if stage.name in budget.MEASURED_S:
            assert stage.box >= 1.5 * budget.MEASURED_S[stage.name], stage.name


def test_a_step_is_launch_bound_at_128_rows_and_flop_bound_at_1024(budget):
    figures = measured(budget)
    at_128 = budget.step_seconds(figures, "original", "fused_batched", 128)
    at_1024 = budget.step_seconds(figures, "original", "fused_batched", 1024)

    assert at_128 == pytest.approx(1_500 * budget.LAUNCH_S)
    assert at_1024 == pytest.approx(8.2e8 * 1024 * 20 / (budget.PEAK_FLOPS * budget.EFFICIENCY))


def test_each_stage_over_its_box_is_named_and_the_optional_one_runs_only_in_what_is_left(
    budget, tmp_path
):
    slow = measured(budget, start_s=50.0)
    slow = measured(budget, start_s=50.0, launches=dict.fromkeys(slow.launches, 400_000))
    summary, problems = budget.verdict(budget.predict(slow))

    over = [problem.split(" predicted")[0] for problem in problems]
    assert over == ["environment", "correctness", "speed", "profile"]
    boxes = {stage.name: stage.box for stage in budget.stages(tmp_path, rehearse=False)}
    left = budget.TOTAL_SECONDS - sum(box for name, box in boxes.items() if name != "inference")
    assert summary["stages"]["inference"]["runs"] is (left >= boxes["inference"])


def test_an_install_that_leaves_the_stages_too_little_time_is_named(budget):
    summary, problems = budget.verdict(budget.predict(measured(budget, install_s=400.0)))

    assert problems == [f"the call predicted {summary['total_s']:.0f} s, over {budget.LIMIT_S} s"]
