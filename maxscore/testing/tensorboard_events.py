"""TensorBoard event files read back without TensorFlow, for tests of what a run logged."""

import pathlib
import struct


def tensorboard_scalars(logdir) -> dict[tuple[str, int], float]:
  """{(tag, step): value} of the event files: records in the TFRecord framing (u64 length, u32 crc,
  Event proto, u32 crc), in time order; a SessionLog START at step s discards earlier events at
  steps >= s, as TensorBoard does."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  events = []
  for path in pathlib.Path(logdir).glob("events.out.tfevents.*"):
    buf, pos = path.read_bytes(), 0
    while pos < len(buf):
      (n,) = struct.unpack("<Q", buf[pos:pos + 8])
      events.append(event_pb2.Event.FromString(buf[pos + 12:pos + 12 + n]))
      pos += 12 + n + 4
  scalars = {}
  for ev in sorted(events, key=lambda e: e.wall_time):
    if ev.HasField("session_log") and ev.session_log.status == event_pb2.SessionLog.START:
      scalars = {k: v for k, v in scalars.items() if k[1] < ev.step}
    for v in ev.summary.value:
      scalars[(v.tag, ev.step)] = v.simple_value
  return scalars
