"""The backtest line of ``hybridflow run``'s human summary."""

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
