"""The run loop and what it drives: intake from trace rows, recording, output, progress."""
