"""How the report writes a value, a time, a metric or a scheme in words: one wording for every section."""

from __future__ import annotations

import datetime
import math
import re

import pandas as pd

from gflbench.data import dataset_spec
from gflbench.data.partition import scheme_title


def slug(*parts: object) -> str:
    """An HTML id and file stem from names: lower case, `+` spelt out, runs of other characters one hyphen."""
    text = "-".join(str(p) for p in parts).replace("+", "plus")
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def pct(value: float | None, decimals: int = 2) -> str:
    """A number for a cell; an undefined one (None, NaN) is an empty cell, never the text `nan`."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{decimals}f}"


def utc(seconds: float | None) -> str:
    """A record's time stamp in UTC, so that the page reads the same wherever it was built."""
    if seconds is None:
        return ""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def metric_name(dataset: str) -> str:
    """The metric a dataset's cells are in, as the captions name it."""
    return "ROC-AUC" if dataset_spec(dataset).metric == "roc_auc" else "accuracy"


def scheme_words(scheme: str) -> str:
    """The paper's words for its two schemes; a new scheme (louvain, dirichlet-α, a split file) by its title."""
    return "non-overlapping (METIS)" if scheme == "metis" else scheme_title(scheme)


def plain_table(frame: pd.DataFrame) -> str:
    """A text frame as an HTML table (pandas escapes the text)."""
    flat = frame.copy()
    flat.columns = [" ".join(p for p in col if p) for col in frame.columns]
    return flat.to_html(classes="plain", border=0, escape=True)
