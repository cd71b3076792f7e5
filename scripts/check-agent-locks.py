#!/usr/bin/env python3
"""Checks every pinned package of the agent images' lock files against the
OSV database (https://osv.dev): a version with a malicious-package advisory
(an id starting MAL-) fails the check; other advisories are listed.

    scripts/check-agent-locks.py [sandbox-image/agents/*/requirements.txt]

Needs network (api.osv.dev). Exit 0: no pinned version is known malicious.
"""
import glob, json, re, sys, urllib.request

files = sys.argv[1:] or sorted(glob.glob("sandbox-image/agents/*/requirements.txt"))
pins = []
for f in files:
    for line in open(f):
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)", line)
        if m:
            pins.append((f, m.group(1), m.group(2)))
queries = [{"package": {"ecosystem": "PyPI", "name": n}, "version": v} for _, n, v in pins]
results = []
for i in range(0, len(queries), 500):
    req = urllib.request.Request(
        "https://api.osv.dev/v1/querybatch",
        data=json.dumps({"queries": queries[i:i + 500]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    results += json.load(urllib.request.urlopen(req, timeout=60))["results"]
malicious, advisories = [], []
for (f, n, v), r in zip(pins, results):
    ids = [x["id"] for x in r.get("vulns", [])]
    for i in ids:
        (malicious if i.startswith("MAL-") else advisories).append(f"{f}: {n}=={v}: {i}")
print(f"checked {len(pins)} pinned versions in {len(files)} lock files against OSV")
for a in advisories:
    print("advisory (not malicious):", a)
for m in malicious:
    print("MALICIOUS:", m)
sys.exit(1 if malicious else 0)
