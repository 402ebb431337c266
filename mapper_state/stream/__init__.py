"""The stream: the byte pump with its scanners, and the FIFO hand-off of the prior state to the tap."""
