"""``python -m bench.sigv4``: the CPU of signing one Bedrock request, the gateway's Signature V4
beside botocore's ``SigV4Auth`` (what ``gateway/providers/aws_sigv4.py`` was chosen by).

Both sign the same Converse request (a 2 KB body, temporary credentials) in rounds that
alternate which goes first; it prints the CPU model, each signer's median µs per request over
the rounds, and their ratio. Both produce the same signature (checked here once, and by
``tests/providers/test_providers_cloud_auth.py`` over several URLs).
"""

from __future__ import annotations

import argparse
import statistics
import time

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from bench.machine import cpu_model
from gateway.providers.aws_sigv4 import AwsCredentials, sign_v4

URL = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
REGION = "us-east-1"
KEY, SECRET, TOKEN = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token"
BODY = b'{"messages":[{"role":"user","content":[{"text":"' + b"x" * 2000 + b'"}]}]}'
HEADERS = {"content-type": "application/json"}


def ours() -> str:
    signed = sign_v4(AwsCredentials(KEY, SECRET, TOKEN), REGION, "POST", URL, HEADERS, BODY)
    return signed["authorization"]


def botocore() -> str:
    request = AWSRequest(method="POST", url=URL, data=BODY, headers=dict(HEADERS))
    SigV4Auth(Credentials(KEY, SECRET, TOKEN), "bedrock", REGION).add_auth(request)
    return request.headers["Authorization"]


def per_call_us(sign: object, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        sign()  # type: ignore[operator]
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="signatures a round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    same_second = ours().rsplit("Signature=", 1)[1] == botocore().rsplit("Signature=", 1)[1]
    times: dict[str, list[float]] = {"switchyard": [], "botocore": []}
    for round_index in range(args.rounds):
        order = [("switchyard", ours), ("botocore", botocore)]
        for name, sign in order if round_index % 2 == 0 else order[::-1]:
            times[name].append(per_call_us(sign, args.calls))
    mine, theirs = (statistics.median(times[name]) for name in ("switchyard", "botocore"))
    print(f"cpu: {cpu_model()}")
    print(f"signatures equal (same second): {same_second}")
    print(f"switchyard sign_v4: {mine:.1f} µs/request (median of {args.rounds} rounds)")
    print(f"botocore SigV4Auth: {theirs:.1f} µs/request")
    print(f"botocore / switchyard: {theirs / mine:.1f}x")


if __name__ == "__main__":
    main()
