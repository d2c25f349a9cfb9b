"""Gubernator's reference cases over gRPC with grpcio, against a running Weir.

The messages are built from pb.gubernator's field numbers with protobuf's own descriptor
machinery (no stub generated here), and called by their full method names, as any
Gubernator client calls them. Time moves through `created_at`, as a client with its own
clock moves it. Exits non-zero, naming the case, on the first answer that differs.

Usage: python3 gubernator_client.py HOST:PORT
"""

import sys
import time

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def build_messages():
    file = descriptor_pb2.FileDescriptorProto(name="gubernator.proto", package="pb.gubernator", syntax="proto3")
    algorithm = file.enum_type.add(name="Algorithm")
    for name, number in (("TOKEN_BUCKET", 0), ("LEAKY_BUCKET", 1)):
        algorithm.value.add(name=name, number=number)
    behavior = file.enum_type.add(name="Behavior")
    for name, number in (("BATCHING", 0), ("NO_BATCHING", 1), ("GLOBAL", 2), ("DURATION_IS_GREGORIAN", 4),
                         ("RESET_REMAINING", 8), ("MULTI_REGION", 16), ("DRAIN_OVER_LIMIT", 32)):
        behavior.value.add(name=name, number=number)
    status = file.enum_type.add(name="Status")
    for name, number in (("UNDER_LIMIT", 0), ("OVER_LIMIT", 1)):
        status.value.add(name=name, number=number)

    def message(name, fields):
        proto = file.message_type.add(name=name)
        for field_name, number, kind, extra in fields:
            field = proto.field.add(name=field_name, number=number, type=kind, label=F.LABEL_OPTIONAL)
            for key, value in extra.items():
                setattr(field, key, value)
        return proto

    def string_map(owner, field_name, number):
        entry = owner.nested_type.add(name=field_name.title().replace("_", "") + "Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        owner.field.add(name=field_name, number=number, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                        type_name=f".pb.gubernator.{owner.name}.{entry.name}")

    req = message("RateLimitReq", [
        ("name", 1, F.TYPE_STRING, {}), ("unique_key", 2, F.TYPE_STRING, {}), ("hits", 3, F.TYPE_INT64, {}),
        ("limit", 4, F.TYPE_INT64, {}), ("duration", 5, F.TYPE_INT64, {}),
        ("algorithm", 6, F.TYPE_ENUM, {"type_name": ".pb.gubernator.Algorithm"}),
        ("behavior", 7, F.TYPE_ENUM, {"type_name": ".pb.gubernator.Behavior"}),
        ("burst", 8, F.TYPE_INT64, {}),
    ])
    string_map(req, "metadata", 9)
    created = req.field.add(name="created_at", number=10, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL,
                            proto3_optional=True, oneof_index=0)
    req.oneof_decl.add(name="_created_at")
    assert created
    resp = message("RateLimitResp", [
        ("status", 1, F.TYPE_ENUM, {"type_name": ".pb.gubernator.Status"}), ("limit", 2, F.TYPE_INT64, {}),
        ("remaining", 3, F.TYPE_INT64, {}), ("reset_time", 4, F.TYPE_INT64, {}), ("error", 5, F.TYPE_STRING, {}),
    ])
    string_map(resp, "metadata", 6)
    batch = file.message_type.add(name="GetRateLimitsReq")
    batch.field.add(name="requests", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                    type_name=".pb.gubernator.RateLimitReq")
    answers = file.message_type.add(name="GetRateLimitsResp")
    answers.field.add(name="responses", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".pb.gubernator.RateLimitResp")
    message("HealthCheckReq", [])
    peer = message("PeerHealthResp", [("grpc_address", 1, F.TYPE_STRING, {}), ("data_center", 2, F.TYPE_STRING, {})])
    assert peer
    health = message("HealthCheckResp", [
        ("status", 1, F.TYPE_STRING, {}), ("message", 2, F.TYPE_STRING, {}), ("peer_count", 3, F.TYPE_INT32, {}),
        ("advertise_address", 4, F.TYPE_STRING, {}),
    ])
    for name, number in (("local_peers", 5), ("region_peers", 6)):
        health.field.add(name=name, number=number, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                         type_name=".pb.gubernator.PeerHealthResp")
    message("LiveCheckReq", [])
    message("LiveCheckResp", [])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    names = ["RateLimitReq", "RateLimitResp", "GetRateLimitsReq", "GetRateLimitsResp", "HealthCheckReq",
             "HealthCheckResp", "LiveCheckReq", "LiveCheckResp"]
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"pb.gubernator.{name}"))
            for name in names}


M = build_messages()
UNDER, OVER = 0, 1
TOKEN, LEAKY = 0, 1
SECOND = 1000


def check(case, got, want):
    if got != want:
        sys.exit(f"{case}: got {got!r}, want {want!r}")


class Client:
    def __init__(self, target):
        channel = grpc.insecure_channel(target)
        self.get = channel.unary_unary("/pb.gubernator.V1/GetRateLimits",
                                       request_serializer=M["GetRateLimitsReq"].SerializeToString,
                                       response_deserializer=M["GetRateLimitsResp"].FromString)
        self.health = channel.unary_unary("/pb.gubernator.V1/HealthCheck",
                                          request_serializer=M["HealthCheckReq"].SerializeToString,
                                          response_deserializer=M["HealthCheckResp"].FromString)
        self.live = channel.unary_unary("/pb.gubernator.V1/LiveCheck",
                                        request_serializer=M["LiveCheckReq"].SerializeToString,
                                        response_deserializer=M["LiveCheckResp"].FromString)

    def ask(self, *requests):
        return list(self.get(M["GetRateLimitsReq"](requests=[M["RateLimitReq"](**r) for r in requests]),
                             timeout=10).responses)


def main():
    client = Client(sys.argv[1])
    now = int(time.time() * 1000)

    # TestOverTheLimit
    for want in ((UNDER, 1), (UNDER, 0), (OVER, 0)):
        r = client.ask(dict(name="test_over_limit", unique_key="account:1234", algorithm=TOKEN,
                            duration=9 * SECOND, limit=2, hits=1))[0]
        check("over the limit", (r.status, r.remaining, r.limit), (*want, 2))
        check("over the limit: reset_time", r.reset_time != 0, True)

    # TestMultipleAsync: two keys in one batch, answered in order.
    first, second = client.ask(
        dict(name="test_multiple_async", unique_key="account:9234", duration=9 * SECOND, limit=2, hits=1),
        dict(name="test_multiple_async", unique_key="account:5678", duration=9 * SECOND, limit=10, hits=5))
    check("batch, first", (first.status, first.remaining, first.limit), (UNDER, 1, 2))
    check("batch, second", (second.status, second.remaining, second.limit), (UNDER, 5, 10))

    # TestTokenBucket, its clock moved by created_at.
    at = now
    for remaining, sleep in ((1, 0), (0, 100), (1, 0)):
        r = client.ask(dict(name="test_token_bucket", unique_key="account:1234", duration=5, limit=2, hits=1,
                            created_at=at))[0]
        check("token bucket", (r.error, r.status, r.remaining, r.limit), ("", UNDER, remaining, 2))
        at += sleep

    # TestLeakyBucket: refills and reset_time, exactly.
    at = now
    steps = ((1, 9, UNDER, 1000), (1, 8, UNDER, 1000), (1, 7, UNDER, 1500), (0, 8, UNDER, 3000), (0, 9, UNDER, 0),
             (9, 0, UNDER, 0), (1, 0, OVER, 3000), (0, 1, UNDER, 60000), (0, 10, UNDER, 60000),
             (10, 0, UNDER, 29000), (9, 0, UNDER, 3000), (1, 0, UNDER, 1000))
    for index, (hits, remaining, status, sleep) in enumerate(steps):
        r = client.ask(dict(name="test_leaky_bucket", unique_key="account:1234", algorithm=LEAKY,
                            duration=30 * SECOND, limit=10, hits=hits, created_at=at))[0]
        check(f"leaky bucket step {index}", (r.status, r.remaining, r.limit), (status, remaining, 10))
        check(f"leaky bucket step {index}: reset_time", r.reset_time, at + (10 - remaining) * 3000)
        at += sleep

    # TestTokenBucketRequestMoreThanAvailable and its leaky twin.
    for algorithm in (TOKEN, LEAKY):
        for status, remaining, hits in ((UNDER, 1000, 1000), (OVER, 1000, 1500), (UNDER, 500, 500),
                                        (UNDER, 100, 400), (UNDER, 0, 100), (OVER, 0, 1)):
            r = client.ask(dict(name="more_than_available", unique_key=f"account:{algorithm}", algorithm=algorithm,
                                duration=1000, limit=2000, hits=hits, created_at=now))[0]
            check(f"more than available ({algorithm}, {hits})", (r.status, r.remaining), (status, remaining))

    # TestDrainOverLimit, the flags as Gubernator's clients send them.
    for algorithm in (TOKEN, LEAKY):
        for hits, remaining, status in ((0, 10, UNDER), (1, 9, UNDER), (100, 0, OVER), (0, 0, UNDER)):
            r = client.ask(dict(name="test_drain_over_limit", unique_key=f"account:1234:{algorithm}",
                                algorithm=algorithm, behavior=32, duration=30 * SECOND, limit=10, hits=hits,
                                created_at=now))[0]
            check(f"drain over limit ({algorithm}, {hits})", (r.status, r.remaining), (status, remaining))

    # TestResetRemaining
    for behavior, remaining in ((0, 99), (0, 98), (8, 100), (0, 99)):
        r = client.ask(dict(name="test_reset_remaining", unique_key="account:1234", duration=9000, limit=100,
                            hits=1, behavior=behavior))[0]
        check("reset remaining", (r.status, r.remaining), (UNDER, remaining))

    # TestChangeLimit
    for algorithm, remaining, limit in ((TOKEN, 99, 100), (TOKEN, 98, 100), (TOKEN, 7, 10), (TOKEN, 6, 10),
                                        (TOKEN, 195, 200), (LEAKY, 99, 100), (LEAKY, 9, 10), (LEAKY, 8, 10)):
        r = client.ask(dict(name="test_change_limit", unique_key="account:1234", algorithm=algorithm,
                            duration=9000, limit=limit, hits=1))[0]
        check("change limit", (r.status, r.remaining, r.limit), (UNDER, remaining, limit))

    # TestMissingFields: errors per item, the batch answered.
    answers = client.ask(dict(name="test_missing_fields", unique_key="account:1234", hits=1, limit=10),
                         dict(name="test_missing_fields", unique_key="account:12345", hits=1, duration=10000),
                         dict(unique_key="account:1234", hits=1, duration=10000, limit=5),
                         dict(name="test_missing_fields", hits=1, duration=10000, limit=5))
    check("missing fields", [(a.error, a.status) for a in answers],
          [("", UNDER), ("", OVER), ("field 'namespace' cannot be empty", UNDER),
           ("field 'unique_key' cannot be empty", UNDER)])

    # The batch limit: 1 000 answered, 1 001 refused whole with OUT_OF_RANGE.
    many = [dict(name="batch", unique_key=str(i), hits=1, limit=1, duration=SECOND) for i in range(1000)]
    check("a batch of 1000", len(client.ask(*many)), 1000)
    try:
        client.ask(*many, dict(name="batch", unique_key="one too many", hits=1, limit=1, duration=SECOND))
        sys.exit("a batch of 1001 was answered")
    except grpc.RpcError as error:
        check("a batch of 1001", error.code(), grpc.StatusCode.OUT_OF_RANGE)
        check("a batch of 1001: message", "max size is '1000'" in error.details(), True)

    health = client.health(M["HealthCheckReq"](), timeout=10)
    check("health", (health.status, health.peer_count, health.advertise_address),
          ("healthy", 1, sys.argv[1]))
    check("health: local peers", [p.grpc_address for p in health.local_peers], [sys.argv[1]])
    client.live(M["LiveCheckReq"](), timeout=10)
    print("all reference cases passed")


main()
