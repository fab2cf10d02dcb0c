#!/usr/bin/env python
"""Where a Spark JVM spent its CPU: a Java Flight Recorder file summarised by component.

    .venv/bin/python benchmarks/jfr_summary.py recording.jfr

Each execution sample (a Java thread on CPU) is charged to the first frame, from the leaf down, that
belongs to a known component (JSON functions, Arrow, Parquet, sorting, Delta log ...); samples with no
such frame are charged to their leaf frame's package. JIT compiler and GC threads are not Java code
and are not sampled: compare the sample count with the JVM's CPU seconds to see their share.
`bench_sink.py --writer spark --jfr FILE` records the first sync this way (JFR is started with `jcmd`).
"""
from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

# (component, frame prefixes or substrings), first match from the leaf wins
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("JSON: get_json_object (Jackson)", ("org.apache.spark.sql.catalyst.expressions.GetJsonObject",
                                         "org.apache.spark.sql.catalyst.json.", "com.fasterxml.jackson",
                                         "org.apache.spark.sql.catalyst.expressions.json.")),
    ("Arrow IPC -> rows (LocalRelation)", ("org.apache.spark.sql.execution.arrow.", "org.apache.arrow.",
                                           "org.apache.spark.sql.connect.planner.SparkConnectPlanner.transformLocalRelation")),
    ("task/closure serialization", ("org.apache.spark.serializer.", "java.io.ObjectOutputStream",
                                    "java.io.ObjectInputStream", "com.esotericsoftware.kryo")),
    ("sort (partitioned write)", ("org.apache.spark.util.collection.unsafe.sort.", "org.apache.spark.sql.execution.SortExec",
                                  "org.apache.spark.sql.execution.UnsafeExternalRowSorter")),
    ("Delta stats collection", ("org.apache.spark.sql.delta.stats.",)),
    ("Parquet encoding", ("org.apache.parquet.", "org.apache.spark.sql.execution.datasources.parquet.")),
    ("compression", ("org.xerial.snappy", "com.github.luben.zstd", "io.airlift.compress", "net.jpountz")),
    ("Delta log / history / commit", ("org.apache.spark.sql.delta.", "io.delta.")),
    ("Spark Connect / gRPC / protobuf", ("org.apache.spark.sql.connect.", "io.grpc.", "com.google.protobuf.",
                                         "io.netty.", "org.sparkproject.connect.")),
    ("codegen / Janino", ("org.codehaus.janino", "org.codehaus.commons",
                          "org.apache.spark.sql.catalyst.expressions.codegen.")),
    ("Catalyst analysis / planning", ("org.apache.spark.sql.catalyst.", "org.apache.spark.sql.execution.",
                                      "org.apache.spark.sql.")),
    ("Hadoop FS / local IO", ("org.apache.hadoop.", "java.io.", "sun.nio.", "java.nio.")),
)
_FRAME = re.compile(r"^\s+([\w$.<>]+)\(")


def jfr_tool(pid: int | None = None) -> str:
    """The `jfr`/`jcmd` bin dir of the JVM `pid` (or of java on PATH)."""
    if pid is not None:
        exe = Path(f"/proc/{pid}/exe")
        try:
            return str(exe.resolve().parent)
        except OSError:
            pass
    java = shutil.which("java")
    return str(Path(java).resolve().parent) if java else ""


def start(pid: int, path: Path) -> None:
    subprocess.run([str(Path(jfr_tool(pid)) / "jcmd"), str(pid), "JFR.start", "name=bench_sink",
                    "settings=profile", f"filename={path}"], check=True, capture_output=True, timeout=60)


def stop(pid: int) -> None:
    subprocess.run([str(Path(jfr_tool(pid)) / "jcmd"), str(pid), "JFR.stop", "name=bench_sink"],
                   check=True, capture_output=True, timeout=120)


def _categorise(frames: list[str]) -> str:
    for frame in frames:
        for component, prefixes in COMPONENTS:
            if any(frame.startswith(p) or p in frame for p in prefixes):
                return component
    leaf = frames[0] if frames else "?"
    return "other: " + ".".join(leaf.split(".")[:3])


def summarise(path: Path, jfr_bin: str | None = None) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, [(component, samples)], [(thread group, samples)]) of the recording's Java samples."""
    tool = str(Path(jfr_bin or jfr_tool()) / "jfr")
    proc = subprocess.Popen([tool, "print", "--events", "jdk.ExecutionSample", "--stack-depth", "64", str(path)],
                            stdout=subprocess.PIPE, text=True, errors="replace")
    components: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    frames: list[str] = []
    thread = ""
    in_stack = False
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("jdk.ExecutionSample"):
            frames, thread, in_stack = [], "", False
        elif "sampledThread = " in line:
            name = line.split('"')[1] if '"' in line else line
            thread = re.sub(r"\d+", "N", name.split(" for task")[0])[:60]
        elif "stackTrace = [" in line:
            in_stack = True
        elif in_stack and line.strip() == "]":
            in_stack = False
            components[_categorise(frames)] += 1
            threads[thread] += 1
        elif in_stack:
            match = _FRAME.match(line)
            if match:
                frames.append(match.group(1))
    proc.wait()
    total = sum(components.values())
    return total, components.most_common(), threads.most_common(8)


def report(path: Path, jvm_cpu: float | None = None, jfr_bin: str | None = None) -> str:
    total, components, threads = summarise(path, jfr_bin)
    lines = [f"JVM CPU by component (JFR execution samples of Java threads: {total}"
             + (f"; JVM CPU {jvm_cpu:.1f} s, JIT/GC threads are not sampled)" if jvm_cpu is not None else ")")]
    for name, count in components[:14]:
        lines.append(f"  {name:<40} {count / max(total, 1):6.1%}")
    lines.append("  by thread: " + ", ".join(f"{name} {count / max(total, 1):.0%}" for name, count in threads))
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1])))
