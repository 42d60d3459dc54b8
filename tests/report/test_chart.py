"""The scheduler report's chart: a PNG of the expected size from a small report, None predictions included."""

from __future__ import annotations

import struct

import pytest

from specrouter.report.chart import DPI, PANEL_WIDTH_IN, ROW_HEIGHT_IN, config_label, name_shortener, write_chart

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHAINS = [["stdlib-1m", "stdlib-29m"], ["stdlib-5m", "stdlib-29m"], ["stdlib-1m", "stdlib-5m", "stdlib-29m"]]


def static(chain: list[str], window: int, tokens_per_s: float, predicted: float | None) -> dict:
    return {"chain": chain, "window": window, "tokens_per_s": tokens_per_s,
            "predicted_t_eff_ms": predicted, "measured_t_eff_ms": 1000 / tokens_per_s}


def run(kind: str, batch_size: int, predicted: bool = True) -> dict:
    configs = [static(c, w, 40.0 * (i + 1) * batch_size, 1000 / (40.0 * (i + 1) * batch_size) * 1.1
                      if predicted and i % 3 else None)
               for i, (c, w) in enumerate((c, w) for c in CHAINS for w in (1, 2, 4))]
    best = max(configs, key=lambda s: s["tokens_per_s"])
    return {"kind": kind, "batch_size": batch_size, "target_only_tokens_per_s": 30.0 * batch_size,
            "adaptive_tokens_per_s": best["tokens_per_s"] * 1.05,
            "best_static": {k: best[k] for k in ("chain", "window", "tokens_per_s")}, "static": configs}


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which follows the signature and a 4-byte length, 4-byte type."""
    return struct.unpack(">II", data[16:24])


def test_writes_a_png_of_one_row_a_kind_plus_the_t_eff_row(tmp_path) -> None:
    # "switching" runs only at batch 1: the (switching, 4) panel says so rather than failing
    report = {"runs": [run("code", 1), run("code", 4), run("prose", 1, predicted=False), run("prose", 4),
                       run("switching", 1)],
              "acceptance": [{"pair": ["stdlib-1m", "stdlib-29m"], "mode": "greedy", "predicted": None,
                              "realized": 0.6}],
              "rank_correlation": {"spearman": 0.9, "configs": 36}}
    path = write_chart(report, tmp_path / "charts" / "report.png")
    assert path == tmp_path / "charts" / "report.png"
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert 20_000 < len(data) < 5_000_000
    width, height = png_size(data)
    assert width == pytest.approx(PANEL_WIDTH_IN * DPI, abs=2)
    assert height == pytest.approx(ROW_HEIGHT_IN * DPI * 4, abs=2)  # code, prose, switching, T_eff


def test_draws_without_any_prediction(tmp_path) -> None:
    report = {"runs": [run("repetitive", 1, predicted=False)], "acceptance": [], "rank_correlation": {}}
    data = write_chart(report, tmp_path / "report.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)


def test_refuses_a_report_without_runs(tmp_path) -> None:
    with pytest.raises(ValueError, match="no runs"):
        write_chart({"runs": [], "acceptance": [], "rank_correlation": {}}, tmp_path / "report.png")


def test_labels_drop_the_shared_prefix_at_a_separator() -> None:
    short = name_shortener(["stdlib-1m", "stdlib-12m", "stdlib-29m"])
    assert config_label(["stdlib-1m", "stdlib-29m"], 3, short) == "1m,29m W3"
    assert config_label(["stdlib-12m", "stdlib-29m"], 4, short) == "12m,29m W4"
    assert name_shortener(["target"])("target") == "target"


class RecordingAxes:
    """What a throughput panel draws, without drawing."""

    def __getattr__(self, name):
        def record(*args, **kwargs):
            if name == "set_yticks":
                self.labels = list(args[1])
        return record


def test_target_only_gets_one_bar_though_it_is_among_the_statics() -> None:
    from specrouter.report.chart import _throughput_panel

    r = run("code", 1)
    r["static"].append(static(["stdlib-29m"], 0, 30.0, 35.0))
    ax = RecordingAxes()
    _throughput_panel(ax, r, lambda name: name)
    assert ax.labels.count("target only") == 1 and ax.labels.count("adaptive") == 1
    assert len(ax.labels) == len(r["static"]) - 1 + 2 and not any("W0" in label for label in ax.labels)
