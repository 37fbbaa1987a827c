"""Asking a peer's tf.distribute.Server whether it is alive, and which incarnation it is: the gRPC
call TensorFlow's collective runtime makes to check a peer's health (`WorkerService.GetStatus`),
made by graphsync's heartbeat (graphsync/between_graph/heartbeat.py) from a TF1 session, where
TensorFlow's own check cannot run."""
from __future__ import annotations


def worker_incarnations(address: str, timeout: float, channels: dict | None = None) -> tuple | None:
    """The device incarnations of the tf.distribute.Server at `address` ('host:port'), asked through
    TensorFlow's own `WorkerService.GetStatus` RPC — the call its collective runtime makes to check
    a peer's health — within `timeout` seconds; None when it does not answer (gone, frozen,
    unreachable). A server restarted on the same address answers with new incarnations.
    `channels` (address → channel) keeps one connection per peer across calls."""
    import grpc

    cache = channels if channels is not None else {}
    channel = cache.get(address)
    if channel is None:
        channel = cache[address] = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
    call = channel.unary_unary("/tensorflow.WorkerService/GetStatus", request_serializer=lambda _: b"",
                               response_deserializer=_get_status_response().FromString)
    try:
        response = call(None, timeout=timeout)
    except grpc.RpcError:
        return None
    finally:
        if channels is None:
            channel.close()
    return tuple(sorted(device.incarnation for device in response.device_attributes))


def _get_status_response():
    """tensorflow.GetStatusResponse (worker.proto, not shipped in the pip package): its one field,
    `repeated DeviceAttributes device_attributes = 1`, declared here."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tensorflow.core.framework import device_attributes_pb2  # noqa: F401 - puts DeviceAttributes in the pool

    pool = descriptor_pool.Default()
    name = "tensorflow.GetStatusResponse"
    try:
        descriptor = pool.FindMessageTypeByName(name)
    except KeyError:
        file = descriptor_pb2.FileDescriptorProto(
            name="graphsync/get_status_response.proto", package="tensorflow", syntax="proto3",
            dependency=["tensorflow/core/framework/device_attributes.proto"])
        message = file.message_type.add(name="GetStatusResponse")
        message.field.add(name="device_attributes", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                          type_name=".tensorflow.DeviceAttributes")
        pool.Add(file)
        descriptor = pool.FindMessageTypeByName(name)
    return message_factory.GetMessageClass(descriptor)
