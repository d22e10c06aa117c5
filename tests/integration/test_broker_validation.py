"""Every request the broker cannot serve is answered with an error code that names what was wrong.

Raw frames and requests go to a real broker process: bad API versions on every api key, bad topic names
and partitions on every API of the table, CreateTopic's partition count and configs.
"""

from __future__ import annotations

import socket
import struct

from metaq.errors import UnsupportedVersionError
from metaq.protocol import messages as m
from metaq.protocol import schema
from metaq.testing import BrokerProcess

BAD_VERSIONS = (-1, -2, -32768, 32767)


def _raw_request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    client_id = b"raw"
    payload = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id + body
    return struct.pack(">I", len(payload)) + payload


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError(f"broker closed the connection after {len(data)} of {n} bytes")
            data += chunk
        return data

    (size,) = struct.unpack(">I", exactly(4))
    return exactly(size)


def _nearest_version(spec: m.ApiSpec, version: int) -> int:
    return min(max(version, spec.min_version), spec.max_version)


def test_every_api_answers_a_bad_version_with_an_error_code(broker: BrokerProcess) -> None:
    """A version outside an API's range (negative ones included) gets UNSUPPORTED_VERSION, encoded in the
    response layout of the nearest version the broker has; the connection stays usable."""
    sock = socket.create_connection((broker.host, broker.port), timeout=30)
    correlation_id = 100
    for api_key, spec in sorted(m.APIS.items()):
        versions = [v for v in BAD_VERSIONS if not spec.min_version <= v <= spec.max_version]
        versions += [spec.min_version - 1, spec.max_version + 1]
        for version in versions:
            correlation_id += 1
            sock.sendall(_raw_request(api_key, version, correlation_id))
            frame = _read_frame(sock)
            assert len(frame) > 4, f"{spec.name} v{version}: a reply with only the correlation id"
            (got_cid,) = struct.unpack_from(">i", frame)
            assert got_cid == correlation_id
            response = schema.decode(spec.response, _nearest_version(spec, version), frame, 4)
            assert response.error_code == UnsupportedVersionError.code, (spec.name, version)
            assert f"v{version}" in response.error_message
    # unknown api keys, with bad versions too: the error prefix alone, still with its code
    for api_key in (-1, 999):
        for version in (-1, 0, 5):
            correlation_id += 1
            sock.sendall(_raw_request(api_key, version, correlation_id))
            frame = _read_frame(sock)
            response = schema.decode(m.ErrorResponse, 0, frame, 4)
            assert response.error_code != 0 and str(api_key) in response.error_message
    # and the connection still serves a good request
    sock.sendall(_raw_request(0, 0, 7, struct.pack(">h", 3) + b"raw"))
    reply = schema.decode(m.ApiVersionsResponse, 0, _read_frame(sock), 4)
    assert reply.error_code == 0 and reply.apis
    sock.close()
