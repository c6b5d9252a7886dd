#!/usr/bin/env python3
"""Calling the state store from Python with paho-mqtt (1.6 or 2.x; Debian: python3-paho-mqtt).

The state store protocol is plain MQTT 5: a RESP3 request published at QoS 1 to the request
topic, with a response topic, correlation data and the user properties __srcId, __ts and
__protVer; the answer comes back on the response topic with the same correlation data. This
script SETs a key, GETs it and DELs it:

    python3 docs/examples/quickstart.py [HOST] [PORT]

crates/node/tests/examples.rs runs it against a real cluster, so it keeps working.
"""

import os
import queue
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

REQUEST_TOPIC = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"


def resp3(*parts: bytes) -> bytes:
    """A RESP3 array of bulk strings: the request payload."""
    out = b"*%d\r\n" % len(parts)
    for part in parts:
        out += b"$%d\r\n%s\r\n" % (len(part), part)
    return out


def main() -> None:
    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 1883
    client_id = "py-quickstart-%d" % os.getpid()
    response_topic = "clients/%s/statestore/response" % client_id
    answers: "queue.Queue[mqtt.MQTTMessage]" = queue.Queue()

    if hasattr(mqtt, "CallbackAPIVersion"):  # paho-mqtt 2.x
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    else:
        client = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv5)
    connected, subscribed = threading.Event(), threading.Event()
    client.on_connect = lambda *_args: connected.set()
    client.on_subscribe = lambda *_args: subscribed.set()
    client.on_message = lambda _client, _userdata, message: answers.put(message)
    client.connect(host, port, keepalive=10)
    client.loop_start()
    if not connected.wait(10):
        sys.exit("no CONNACK from %s:%d" % (host, port))
    client.subscribe(response_topic, qos=1)
    if not subscribed.wait(10):
        sys.exit("no SUBACK for %s" % response_topic)

    counter = 0

    def request(*parts: bytes) -> tuple[bytes, str]:
        """Publishes one request and waits for its answer: (payload, __stat)."""
        nonlocal counter
        counter += 1
        properties = Properties(PacketTypes.PUBLISH)
        properties.ResponseTopic = response_topic
        properties.CorrelationData = counter.to_bytes(16, "big")
        properties.MessageExpiryInterval = 10
        # __ts is a hybrid logical clock: milliseconds:counter:node id.
        timestamp = "%015d:%05d:%s" % (int(time.time() * 1000), counter, client_id)
        properties.UserProperty = [("__srcId", client_id), ("__ts", timestamp), ("__protVer", "1.0")]
        client.publish(REQUEST_TOPIC, resp3(*parts), qos=1, properties=properties)
        while True:
            message = answers.get(timeout=10)
            if message.properties.CorrelationData == properties.CorrelationData:
                status = dict(message.properties.UserProperty).get("__stat", "")
                return message.payload, status

    print("SET", request(b"SET", b"quickstart/python", b"hello from python", b"PX", b"60000"))
    print("GET", request(b"GET", b"quickstart/python"))
    print("DEL", request(b"DEL", b"quickstart/python"))
    client.loop_stop()
    client.disconnect()


if __name__ == "__main__":
    main()
