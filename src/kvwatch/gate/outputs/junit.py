"""The summary as a JUnit report: one test case per run and detector.

A failed detector is a ``<failure>`` with its evidence; a detector that
raised, or a run that broke, an ``<error>``; a skipped one ``<skipped>``. A
run whose probes carried notices (broken invariants its engine holds
harmless) gets a ``notices`` case listing them: passing, its lines in
``<system-out>``, or with ``--strict`` a ``<failure>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from kvwatch.gate.outputs.summary import GateSummary
from kvwatch.gate.verdicts.detectors import ERROR, FAIL, SKIPPED


def junit_xml(summary: GateSummary) -> str:
    suite = ET.Element("testsuite", name="kvwatch-gate")
    counts = {"tests": 0, "failures": 0, "skipped": 0, "errors": 0}
    for run in summary.runs:
        classname = f"kvwatch.{run.profile}.c{run.concurrency}"
        if run.error:
            case = ET.SubElement(suite, "testcase", classname=classname, name="run")
            ET.SubElement(case, "error", message=run.error)
            counts["tests"] += 1
            counts["errors"] += 1
        for name, v in run.verdicts.items():
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            counts["tests"] += 1
            if v.verdict in (FAIL, ERROR):
                failed = v.verdict == FAIL
                counts["failures" if failed else "errors"] += 1
                message = f"first failing turn {v.first_turn}" if failed else "the detector raised"
                node = ET.SubElement(case, "failure" if failed else "error", message=message)
                lines = [*([v.story] if v.story else []), v.summary()]
                lines += [e.detail for e in v.evidence[1:]]
                lines += [line for e in v.evidence[:1] for line in e.traceback]
                node.text = "\n".join(lines)
            elif v.verdict == SKIPPED:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=v.summary())
        if run.notices:
            case = ET.SubElement(suite, "testcase", classname=classname, name="notices")
            counts["tests"] += 1
            lines = [f"turn {t}: {f.kind} {f.group or ''}: {f.detail}" for t, f in run.notices]
            if summary.strict:
                counts["failures"] += 1
                message = f"{len(lines)} notices (--strict fails on any)"
                ET.SubElement(case, "failure", message=message).text = "\n".join(lines)
            else:
                ET.SubElement(case, "system-out").text = "\n".join(lines)
    for key, value in counts.items():
        suite.set(key, str(value))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def write_junit(summary: GateSummary, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit_xml(summary))
