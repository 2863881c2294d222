#!/usr/bin/env python3
"""Compares the storage e2e suite's JUnit results of runs test by test.

    compare.py BASELINE_DIR OTHER_DIR [OTHER_DIR ...]

Each directory holds the junit_*.xml files of one run. Prints, per run, the tests run, passed,
failed and skipped (tests the suite skipped for the driver's capabilities count as skipped; the
suite's thousands of tests outside the focus are not counted), then every test whose outcome
differs from the baseline's. Exits 1 when a test that passed in the baseline did not pass in
another run, or when a run has no results at all.
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


SUITE_NODES = ("[SynchronizedBeforeSuite]", "[SynchronizedAfterSuite]", "[ReportBeforeSuite]",
               "[ReportAfterSuite]")


def outcomes(directory):
    """Test name -> "passed" | "failed" | "skipped", for the tests a run looked at."""
    results = {}
    files = sorted(Path(directory).glob("junit_*.xml"))
    for path in files:
        for case in ET.parse(path).getroot().iter("testcase"):
            name = case.get("name", "")
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "failed"
            elif case.find("skipped") is not None:
                message = (case.find("skipped").get("message") or "").lower()
                # The tests outside --focus are reported as skipped with no reason: they are
                # not part of this run. Those the suite skips for the driver's capabilities
                # say why.
                if message == "skipped":
                    continue
                outcome = "skipped"
            else:
                outcome = "passed"
            # The suite's set-up and reports count only when they failed.
            if name.startswith(SUITE_NODES) and outcome != "failed":
                continue
            # A test run by several processes (or twice) counts by its worst outcome.
            rank = {"failed": 2, "passed": 1, "skipped": 0}
            if name not in results or rank[outcome] > rank[results[name]]:
                results[name] = outcome
    return files, results


def summary(results):
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome in results.values():
        counts[outcome] += 1
    run = counts["passed"] + counts["failed"]
    return run, counts


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for directory in argv[1:]:
        files, results = outcomes(directory)
        if not files:
            print(f"{directory}: no junit_*.xml", file=sys.stderr)
            return 1
        runs.append((directory, results))
    print(f"| run | run | passed | failed | skipped |\n|---|---|---|---|---|")
    for directory, results in runs:
        run, counts = summary(results)
        print(f"| {Path(directory).name} | {run} | {counts['passed']} | {counts['failed']} | {counts['skipped']} |")
    status = 0
    base_name, base = runs[0]
    for directory, results in runs[1:]:
        name = Path(directory).name
        names = sorted(set(base) | set(results))
        differ = [(n, base.get(n, "absent"), results.get(n, "absent")) for n in names
                  if base.get(n, "absent") != results.get(n, "absent")]
        print(f"\n{name} against {Path(base_name).name}: {len(differ)} tests differ")
        for test, was, now in differ:
            print(f"- {Path(base_name).name} {was}, {name} {now}: {test}")
            if was == "passed" and now != "passed":
                status = 1
    failed_anywhere = any(o == "failed" for _, r in runs for o in r.values())
    if failed_anywhere and status == 0:
        print("\nevery test that passed in the baseline passed in the others; some failed in all")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
