"""Reads a TensorBoard log directory back with TensorBoard's own code, for tests/train/tensorboard_spec.lua.
Runs in the venv of third_party/test-python.txt.

  tensorboard_reader.py DIR   prints, one per line:
    scalar TAG STEP VALUE WALL_TIME   every scalar as EventAccumulator (what TensorBoard shows) loads
                                      it, with purge_orphaned_data off so that it hides nothing
    event FILE STEP VALUES            every record with a summary, file by file in the order
                                      TensorBoard reads them (names sorted): the steps as stored
Values are float32 widened to double, printed by repr (exact: the double reads back the same).
"""
import glob
import os
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2


def main(directory):
    accumulator = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.SCALARS: 0}, purge_orphaned_data=False)
    accumulator.Reload()
    for tag in accumulator.Tags()["scalars"]:
        for e in accumulator.Scalars(tag):
            print("scalar", tag, e.step, repr(e.value), repr(e.wall_time))
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for record in RawEventFileLoader(path).Load():
            event = event_pb2.Event.FromString(record)
            if event.HasField("summary"):
                print("event", os.path.basename(path), event.step, len(event.summary.value))


if __name__ == "__main__":
    main(sys.argv[1])
