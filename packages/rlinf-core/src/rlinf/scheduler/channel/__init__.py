"""Named FIFO channels between workers (see ``channel.channel``)."""

from .channel import Channel, create_channel_from_worker

__all__ = ["Channel", "create_channel_from_worker"]
