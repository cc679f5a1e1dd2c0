#!/usr/bin/env python3
"""A consumer of MultiPilot subjects written from the published contract alone.

It uses nothing of MultiPilot's code: any NATS client, any MessagePack library and the JSON Schemas in
schemas/json/. It reads every stream from the start (ordered JetStream consumers), decodes each message with
msgpack, picks the schema from the `Multipilot-Schema` header (`<Name>/<major>`) and validates the decoded
message against `<Name>.v<major>.schema.json`.

    pip install nats-py msgpack jsonschema
    python3 schemas/examples/consumer.py --url nats://127.0.0.1:4222 --subject 'fleet.>'

With --expect, it exits 0 once every named schema has validated at least once (and non-zero on a validation
failure or a timeout), which is how the test suite runs it.
"""

import argparse
import asyncio
import json
import pathlib
import sys

import jsonschema
import msgpack
import nats
from nats.js.api import DeliverPolicy

HERE = pathlib.Path(__file__).resolve().parent
SCHEMAS = HERE.parent / "json"


def load_validators(directory):
    validators = {}
    for path in sorted(directory.glob("*.schema.json")):
        name, version = path.name[: -len(".schema.json")].split(".v")
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        validators[f"{name}/{version}"] = jsonschema.Draft202012Validator(schema)
    return validators


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="nats://127.0.0.1:4222")
    ap.add_argument("--subject", default="fleet.>")
    ap.add_argument("--schemas", default=str(SCHEMAS))
    ap.add_argument("--expect", default="", help="comma-separated schema names, or 'all'")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    validators = load_validators(pathlib.Path(args.schemas))
    expect = set(v.split("/")[0] for v in validators) if args.expect == "all" else set(filter(None, args.expect.split(",")))
    seen, errors = {}, []
    done = asyncio.Event()

    async def on_message(msg):
        headers = msg.headers or {}
        header = headers.get("Multipilot-Schema")
        ctype = headers.get("Content-Type")
        try:
            if ctype != "application/msgpack":
                raise ValueError(f"content type {ctype!r}")
            if header not in validators:
                raise ValueError(f"unknown schema {header!r}")
            body = msgpack.unpackb(msg.data, raw=False)
            validators[header].validate(body)
            if body["schema"] + "/" + str(body["version"]) != header:
                raise ValueError(f"body says {body['schema']}/{body['version']}, header says {header}")
            name = header.split("/")[0]
            seen[name] = seen.get(name, 0) + 1
            print(f"ok {msg.subject} {header} cluster={body['cluster']} seq={body['seq']}", flush=True)
        except Exception as e:  # report, keep consuming
            errors.append(f"{msg.subject}: {e}")
            print(f"INVALID {msg.subject}: {e}", flush=True)
        if expect and expect.issubset(seen):
            done.set()

    nc = await nats.connect(args.url)
    js = nc.jetstream()
    subs = []
    for info in await js.streams_info():
        for subject in info.config.subjects:
            subs.append(await js.subscribe(subject, stream=info.config.name, ordered_consumer=True,
                                           deliver_policy=DeliverPolicy.ALL, cb=on_message))
    try:
        await asyncio.wait_for(done.wait(), timeout=args.timeout)
    except asyncio.TimeoutError:
        if expect:
            errors.append(f"timed out; never saw {sorted(expect - set(seen))}")
    finally:
        await nc.close()
    print(json.dumps({"validated": seen, "errors": errors}), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
