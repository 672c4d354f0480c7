"""The backtest, leaderboard and stage lines of ``hybridflow run``'s human summary."""

from __future__ import annotations

from cli.commands.run import format_backtest


def test_backtest_line_shows_model_against_baseline_or_why_it_was_skipped():
    done = {
        "status": "done",
        "model": {
            "auc": 0.9343,
            "logloss": 0.2758,
            "ece": 0.0071,
            "mean_score": 0.2536,
            "positive_rate": 0.2542,
        },
        "baseline": {"logloss": 0.3797},
    }
    assert format_backtest(done) == (
        "ROC AUC 0.9343 | log loss 0.2758 (baseline 0.3797) | ECE 0.0071 | "
        "mean score 0.254 vs rate 0.254"
    )
    skipped = {"status": "skipped", "reason": "history too short for the backtest"}
    assert format_backtest(skipped) == "skipped (history too short for the backtest)"
    assert format_backtest({}) == "skipped (no backtest)"


def test_leaderboard_lines_star_the_champion_in_the_ranked_order():
    from cli.commands.run import format_leaderboard

    row = {"auc": 0.88, "ece": 0.01, "mean_score": 0.31, "positive_rate": 0.32}
    row |= {"train_seconds": 1.5, "device": "cpu", "pool": "cpu-pool", "basis": "backtest"}
    rows = [
        row | {"family": "mlp", "logloss": 0.3951, "size": 4097, "champion": True},
        row | {"family": "logistic", "logloss": 0.3953, "size": 31, "champion": False},
    ]
    lines = format_leaderboard(rows, "mlp won on backtest")
    assert lines[0] == "  champion    : mlp won on backtest"
    assert "(backtest, calibrated)" in lines[1]
    assert lines[2].split()[:3] == ["*mlp", "0.8800", "0.3951"] and "4,097" in lines[2]
    assert lines[3].split()[:3] == ["logistic", "0.8800", "0.3953"]
    assert format_leaderboard([], "") == []


def test_stage_lines_keep_the_seconds_aligned_for_long_stage_names():
    from cli.commands.run import stage_lines
    from tasks.reporting.records import StageReport

    lines = stage_lines(
        [
            StageReport(name="validate", seconds=4.1, pool="cpu-pool"),
            StageReport(name="contender-logistic", seconds=0.8, pool="cpu-pool"),
            StageReport(name="train", seconds=0.2, pool="cpu-pool", cached=True),
        ]
    )
    assert len({line.index("s  cpu") for line in lines}) == 1, lines
    assert lines[2].endswith("cpu-pool  (cached)")
