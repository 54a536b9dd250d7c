"""Stored runs keep their keys: every committed record's run key follows from its configuration.

`gflbench table` and `run` find a stored run by recomputing its key from a spec (gfl_bench/experiments/spec.py). A change
to that computation (a new Params field, a field leaving the key, a renamed value) that would give any
committed run another key orphans it silently; here it fails, naming the run.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gflbench.errors import UserError
from gflbench.experiments.spec import make_spec, spec_of_record

RECORDS = sorted((Path(__file__).resolve().parent.parent / "results" / "records").glob("*.jsonl.gz"))


def _records() -> list[dict]:
    return [json.loads(line) for path in RECORDS for line in gzip.open(path, "rt", encoding="utf-8")]


def test_every_committed_record_keeps_its_run_key():
    records = _records()
    assert len(records) > 700 and {r["method"] for r in records} >= {"fediih", "adafgl", "fedgmc"}
    moved = [f"{r['method']} {r['dataset']} seed {r['seed']} ({r['run_key']})" for r in records
             if spec_of_record(r).run_key != r["run_key"] or spec_of_record(r).config_key != r["config_key"]]  # fmt: skip
    assert not moved, f"{len(moved)} committed runs would get another key: {moved[:5]}"


def test_a_record_that_predates_a_field_is_read_at_the_value_it_ran_with():
    """AdaFGL's runs before `keep_best_epoch` kept the best epoch. Their committed records were upgraded once
    (gfl_bench/experiments/upgrades.py) and keep the keys they had in `upgrades`: the record as it was then (the
    field absent, the old keys) is read with the switch on and gets the upgraded key, which is the key
    `make_spec` gives with the switch on; read at today's default (off) it would not be."""
    upgraded = next(r for r in _records() if r["method"] == "adafgl" and r.get("upgrades"))
    (history,) = upgraded["upgrades"]
    assert history["filled"] == {"keep_best_epoch": True}
    params = {k: v for k, v in upgraded["config"]["params"].items() if k != "keep_best_epoch"}
    before = {k: v for k, v in upgraded.items() if k != "upgrades"}
    before |= {"config": {**upgraded["config"], "params": params}, "run_key": history["run_key"],
               "config_key": history["config_key"]}  # fmt: skip
    spec = spec_of_record(before)
    assert spec.params.keep_best_epoch is True and spec.run_key == upgraded["run_key"] != history["run_key"]
    config = upgraded["config"]
    again = make_spec("adafgl", before["dataset"], before["scheme"], before["clients"], before["seed"],
                      {k: json.dumps(v) if isinstance(v, bool) else str(v) for k, v in config["params"].items()},
                      config["rounds"], config["local_epochs"], config["data_seed"], config["protocol"])  # fmt: skip
    assert again.run_key == upgraded["run_key"]
    assert make_spec("adafgl", before["dataset"], before["scheme"], before["clients"], before["seed"],
                     {"keep_best_epoch": "false"}).run_key != upgraded["run_key"]  # fmt: skip


def test_a_record_of_another_harness_or_with_unknown_fields_is_refused_in_one_line():
    record = _records()[0]
    with pytest.raises(UserError, match="harness version 1"):
        spec_of_record({**record, "config": {**record["config"], "harness": 1}})
    params = {**record["config"]["params"], "no_such_field": 1}
    with pytest.raises(UserError, match="do not fit"):
        spec_of_record({**record, "config": {**record["config"], "params": params}})
