"""The Spark side over TLS: options caFile, certFile and keyFile (pyspark_leveret/tls.py) against a broker of
the test's own with an ``amqps`` listener that asks for a client certificate (verify_peer,
fail_if_no_peer_cert) and an HTTPS management API, certificates made by trustme as tests/integration/tls/
makes them. A read and a write with the CA and a client certificate work; without the CA, with another CA,
or without a client certificate they fail with an error that names the option to set.
"""

from __future__ import annotations

import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import trustme
from pyspark_leveret.amqp_read import AMQPReadError
from pyspark_leveret.client import ManagementError
from pyspark_leveret.publisher import publish_confirmed
from pyspark_leveret.reader import LeveretBatchReader, StreamPartition
from pyspark_leveret.rows_to_messages import Message, WriteOptionError
from pyspark_leveret.schema import READ_STRUCT
from pyspark_leveret.writer import parse_write_options
from read_helpers import declare_stream, fill, read_partitions, stream_info

from tests.conftest import free_port

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("tls")
    ca, other = trustme.CA(organization_name="Leveret pipeline CA"), trustme.CA(organization_name="Another CA")
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("spark.leveret.test", common_name="leveret-spark")
    paths = SimpleNamespace(ca=root / "ca.pem", other_ca=root / "other.pem", cert=root / "server.pem",
                            key=root / "server.key", client_cert=root / "client.pem", client_key=root / "client.key",
                            ca_obj=ca)
    ca.cert_pem.write_to_path(str(paths.ca))
    other.cert_pem.write_to_path(str(paths.other_ca))
    paths.cert.write_bytes(server.cert_chain_pems[0].bytes())
    server.private_key_pem.write_to_path(str(paths.key))
    paths.client_cert.write_bytes(client.cert_chain_pems[0].bytes())
    client.private_key_pem.write_to_path(str(paths.client_key))
    return paths


@pytest.fixture
def tls_broker(start_broker, certs) -> Iterator[SimpleNamespace]:
    amqps, https = free_port(), free_port()
    keys = {"listeners.ssl.default": f"127.0.0.1:{amqps}", "ssl_options.cacertfile": certs.ca,
            "ssl_options.certfile": certs.cert, "ssl_options.keyfile": certs.key,
            "ssl_options.verify": "verify_peer", "ssl_options.fail_if_no_peer_cert": "true",
            "management.ssl.port": https, "management.ssl.certfile": certs.cert,
            "management.ssl.keyfile": certs.key, "management.ssl.cacertfile": certs.ca}
    b = start_broker(*[arg for key, value in keys.items() for arg in ("--set", f"{key}={value}")])
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    deadline = time.monotonic() + 15
    while True:  # the HTTPS listener comes up just after the AMQP port the fixture waits for
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{https}/api/overview", timeout=5, context=ctx)
        except urllib.error.HTTPError:
            break  # 401: serving
        except OSError:
            assert time.monotonic() < deadline, "the HTTPS API did not come up"
            time.sleep(0.05)
    yield SimpleNamespace(broker=b, amqps=f"amqps://guest:guest@127.0.0.1:{amqps}/%2F",
                          https=f"https://127.0.0.1:{https}", http=f"http://127.0.0.1:{b.management_port}")


def test_read_and_write_over_tls_with_ca_and_client_certificate(tls_broker, certs, uid):
    b = tls_broker.broker
    q = declare_stream(b, f"{uid}-s")  # set up over plain AMQP
    fill(b, q, 20)
    files = {"caFile": str(certs.ca), "certFile": str(certs.client_cert), "keyFile": str(certs.client_key)}
    opts = {"uri": tls_broker.amqps, "managementUri": tls_broker.https, "queue": q, **files}
    reader = LeveretBatchReader(opts, READ_STRUCT)
    parts = reader.partitions()  # the HTTPS API, trusting caFile
    assert parts == [StreamPartition(q, 0, 20)]
    assert read_partitions(reader, parts).column("offset").to_pylist() == list(range(20))  # amqps
    # A time position asks the broker over amqps too.
    timed = LeveretBatchReader({**opts, "startingTimestamp": "0"}, READ_STRUCT)
    assert timed.partitions() == [StreamPartition(q, 0, 20)]
    # The writer takes the same options (pika over TLS).
    settings, _ = parse_write_options({"uri": tls_broker.amqps, **files})
    from pika import BasicProperties

    sent = publish_confirmed(settings, iter([[Message("", q, b"over tls", BasicProperties())] * 5]))
    assert sent == 5 and stream_info(b, q)["next_offset"] == 25


def test_tls_without_the_ca_or_a_client_certificate_fails_clearly(tls_broker, certs, uid):
    b = tls_broker.broker
    q = declare_stream(b, f"{uid}-s")
    fill(b, q, 3)
    client = {"certFile": str(certs.client_cert), "keyFile": str(certs.client_key)}
    base = {"uri": tls_broker.amqps, "queue": q}
    # No caFile: the system's CAs do not know the test CA; the HTTPS API and amqps both say what to set.
    with pytest.raises(ManagementError, match=r"the management API: the broker's certificate was not accepted "
                                              r"\(.*\): give the CA that signed .* with option caFile"):
        LeveretBatchReader({**base, "managementUri": tls_broker.https, **client}, READ_STRUCT).partitions()
    plain_api = {**base, "managementUri": tls_broker.http}
    for extra in (client, {**client, "caFile": str(certs.other_ca)}):
        reader = LeveretBatchReader({**plain_api, **extra}, READ_STRUCT)
        with pytest.raises(AMQPReadError, match=r"TLS with 127.0.0.1:\d+: the broker's certificate was not accepted "
                                                r"\(.*\): give the CA .* with option caFile"):
            list(reader.read(StreamPartition(q, 0, 3)))
    # The CA but no client certificate: the broker refuses, and the error names certFile and keyFile.
    reader = LeveretBatchReader({**plain_api, "caFile": str(certs.ca)}, READ_STRUCT)
    with pytest.raises(AMQPReadError, match="needs options certFile and keyFile"):
        list(reader.read(StreamPartition(q, 0, 3)))
    with pytest.raises(ValueError, match="option caFile: cannot read"):
        LeveretBatchReader({**plain_api, "caFile": str(Path(certs.ca).with_name("none.pem"))}, READ_STRUCT)
    with pytest.raises(ValueError, match="option caFile: no CA certificate"):
        LeveretBatchReader({**plain_api, "caFile": str(certs.client_key)}, READ_STRUCT)
    with pytest.raises(ValueError, match="keyFile needs certFile"):
        LeveretBatchReader({**plain_api, "keyFile": str(certs.client_key)}, READ_STRUCT)
    with pytest.raises(WriteOptionError, match="option certFile / keyFile|options certFile / keyFile"):
        parse_write_options({"uri": tls_broker.amqps, "certFile": str(certs.ca)})


def test_the_queue_source_reads_and_acks_over_tls(tls_broker, certs, uid):
    """The classic/quorum queue source (pyspark_leveret/queue_source.py) takes the same TLS options: the driver
    finds the queue's type over the HTTPS API, takes and acks its batches over amqps with the client
    certificate, and a committed batch leaves the queue empty."""
    from pyspark.sql.streaming.datasource import ReadMaxRows
    from pyspark_leveret import LeveretDataSource
    from pyspark_leveret.queue_source import LeveretQueueStreamReader
    from test_queue_source import counts, declare, ids

    b = tls_broker.broker
    q = declare(b, f"{uid}-q", "quorum", 12)  # set up over plain AMQP
    files = {"caFile": str(certs.ca), "certFile": str(certs.client_cert), "keyFile": str(certs.client_key)}
    opts = {"uri": tls_broker.amqps, "managementUri": tls_broker.https, "queue": q, "minPartitions": "2", **files}
    driver = LeveretDataSource(opts).streamReader(READ_STRUCT)
    assert type(driver) is LeveretQueueStreamReader
    try:
        start = driver.initialOffset()
        end = driver.latestOffset(start, ReadMaxRows(100))
        assert end == {q: 12}
        assert sorted(ids(driver, driver.partitions(start, end))) == list(range(12))
        assert counts(b, q) == (0, 0)  # taken over amqps (unacked: no consumer left between batches)
        driver.commit(end)
    finally:
        driver.stop()  # what was taken and not acked would go back to the queue now
    assert counts(b, q) == (0, 0)  # acked over amqps at the commit: nothing came back
