"""The benchmark's printed table ends with a two-line legend whose words are
--help's column definitions (both come from report.DEFINITIONS)."""

import re
import types

import pytest

from localargmax.bench import cli, report


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _rows(op: str):
    return [
        dict(
            method="full-gather",
            op=op,
            shape="s",
            tp=2,
            batch=1,
            median_us=10.0,
            p90_us=12.0,
            bytes_sent_per_rank=8,
            bytes_recv_per_rank=8,
            speedup_vs_full_gather=1.0,
            agree=1.0,
        )
    ]


@pytest.mark.parametrize(
    "op,kernel_only,names",
    [
        ("argmax", False, ("speedup", "agree", "sent_B", "recv_B")),
        ("topk", False, ("speedup", "agree_topk", "sent_B", "recv_B")),
        ("sample", False, ("speedup", "tp_inv", "sent_B", "recv_B")),
        ("argmax", True, ("vs_torch", "of_stream", "kernel_median_us", "gbps")),
    ],
)
def test_legend_is_two_lines_in_the_words_of_help(op, kernel_only, names):
    legend = report.format_legend(_rows(op), kernel_only)
    help_text = _words(cli.build_parser("localargmax-bench").format_help())
    assert len(legend.splitlines()) == 2
    for name in names:
        definition = report.DEFINITIONS[name]
        assert definition in legend
        assert _words(definition) in help_text, f"--help lacks the definition of {name}: {definition!r}"


def test_legend_follows_the_printed_table(capsys):
    cfg = types.SimpleNamespace(json_path=None, threads=1, steps=3, warmup=1)
    rows = _rows("argmax")
    for r in rows:
        r.update(device="cpu", dtype="float32")
    report.finish(rows, cfg, kernel_only=False)
    out = capsys.readouterr().out
    assert out.endswith(report.format_table(rows, False) + "\n" + report.format_legend(rows, False) + "\n")
    assert out.splitlines()[-2].startswith("speedup = full-gather's median time / this row's")
