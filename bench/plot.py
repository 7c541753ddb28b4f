#!/usr/bin/env python3
"""TFLOP/s against sequence length from a bench results JSON, like the FlashAttention papers' plots.

One panel per (head_dim, causal) of the sweep rows (bf16, batch x seqlen = 16384, heads x head_dim
= 2048), one line per implementation.

Usage: python3 bench/plot.py bench/results/h200.json [-o h200.png]
"""

import argparse
import json
import pathlib

STYLE = {  # a fixed colour per implementation, so figures from different runs compare at a glance
    "ours": ("tab:red", "o"),
    "ours_sm80": ("tab:orange", "v"),
    "ours_sm90": ("tab:purple", "^"),
    "torch_flash": ("tab:blue", "s"),
    "torch_cudnn": ("tab:green", "D"),
    "torch_efficient": ("tab:gray", "x"),
    "fa3": ("black", "*"),
}


def sweep_rows(document):
    return [r for r in document["rows"]
            if "kind" not in r and r["dtype"] == "bf16" and r["sq"] == r["sk"]
            and r["b"] * r["sq"] == 16384 and r["h"] * r["d"] == 2048]


def plot(document, png_path):
    """Writes the figure to png_path and returns it, or None when there is no sweep row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sweep_rows(document)
    panels = sorted({(r["d"], r["causal"]) for r in rows})
    if not panels:
        return None
    columns = min(len(panels), 3)
    lines_of_panels = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(lines_of_panels, columns, squeeze=False,
                             figsize=(5.2 * columns, 4 * lines_of_panels))
    for ax, (d, causal) in zip(axes.flat, panels):
        mine = sorted((r for r in rows if r["d"] == d and r["causal"] == causal),
                      key=lambda r: r["sq"])
        names = sorted({n for r in mine for n in r["tflops"]},
                       key=lambda n: list(STYLE).index(n) if n in STYLE else len(STYLE))
        for name in names:
            points = [(r["sq"], r["tflops"][name]) for r in mine if name in r["tflops"]]
            colour, marker = STYLE.get(name, (None, "."))
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, color=colour,
                    label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["sq"] for r in mine])
        ax.set_xticklabels(
            [f"{r['sq'] // 1024}k" if r["sq"] >= 1024 else str(r["sq"]) for r in mine])
        ax.set_ylim(bottom=0)
        ax.set_title(f"head_dim {d}, {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    # Rows merged from a later run carry their own commit; the file's is the first run's.
    commits = sorted({str(r.get("commit", document.get("commit", "")))[:10] for r in rows})
    commit = ", ".join(commits)
    fig.suptitle(f"Attention forward, bf16, {document.get('gpu', '')} "
                 f"(commit {commit}, torch {document.get('torch', '')})")
    fig.tight_layout()
    png_path = pathlib.Path(png_path)
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a bench results JSON")
    parser.add_argument("-o", "--out", help="PNG path (default: the JSON's path with .png)")
    args = parser.parse_args()
    path = pathlib.Path(args.results)
    png = plot(json.loads(path.read_text()), args.out or path.with_suffix(".png"))
    print(f"wrote {png}" if png else "no sweep rows to plot")


if __name__ == "__main__":
    main()
