"""Result tables a person can read and plot: the same rows as markdown, CSV and a bar chart."""
import csv
from pathlib import Path

from .writer import markdown_table


def columns(rows: list[dict], first: list[str]) -> list[str]:
    """`first` in order, then every other key any row has, sorted."""
    rest = sorted({k for r in rows for k in r} - set(first))
    return [c for c in first if any(c in r for r in rows)] + rest


def write_table_files(run_dir: Path, stem: str, rows: list[dict], first: list[str], metric: str, label: str,
                      title: str, plot: bool = True) -> None:
    """<stem>.md, <stem>.csv (rows may have different keys: the union, blanks where a row has none) and
    <stem>.png (`metric` per row, labelled by `label`, on a linear axis from zero)."""
    run_dir = Path(run_dir)
    cols = columns(rows, first)
    # the markdown is for reading: a column other than `first` that is the same in every row (or blank in every
    # row) says nothing about the rows' differences, so it stays in the CSV only
    shown = [c for c in cols if c in first or len(rows) < 2 or len({repr(r.get(c)) for r in rows}) > 1]
    note = (f"\n{len(cols) - len(shown)} columns equal in every row are in {stem}.csv only.\n"
            if len(shown) < len(cols) else "")
    (run_dir / f"{stem}.md").write_text(f"# {title}\n\n" + markdown_table(rows, shown) + "\n" + note)
    with open(run_dir / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, restval="")
        w.writeheader()
        w.writerows(rows)
    if not plot:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    vals = [r.get(metric) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4.5))
    ax.bar(range(len(rows)), [v if isinstance(v, (int, float)) else 0 for v in vals],
           color=["C0" if isinstance(v, (int, float)) else "0.8" for v in vals])
    ax.set_xticks(range(len(rows)), [str(r.get(label, i)) for i, r in enumerate(rows)], rotation=30, ha="right",
                  fontsize=8)
    ax.set_ylabel(metric)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(run_dir / f"{stem}.png", dpi=120)
    plt.close(fig)
