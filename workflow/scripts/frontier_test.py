"""T5_frontier: the served-frontier test a config declares (`inference.frontier_test`; docs/study.md "The
served-frontier study"), computed by mohge_studies.analysis.served_frontier from the collected inference rows.

Inputs: rows (inference.csv). Outputs: csv and md (T5_frontier). Params: trained, served (family+variant), alpha.
"""

from pathlib import Path

import mohge_studies.analysis.plotstyle as ps
import pandas as pd
from mohge_studies.analysis import served_frontier


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """The served-frontier test (T5_frontier) from the collected inference rows."""
    rows = pd.read_csv(inputs["rows"])
    table = served_frontier.frontier_test(rows, params["trained"], params["served"], float(params.get("alpha", 0.05)))
    Path(outputs["csv"]).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(outputs["csv"], index=False)
    Path(outputs["md"]).write_text(ps.pipe_table(table, served_frontier.CAPTION))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
