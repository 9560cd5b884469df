"""Named FIFO channels between workers (see ``channel.channel``), and RLinf's ``ChannelWorker`` /
``WeightedItem`` (see ``channel.channel_worker``).

Layer: the public API, above ``worker`` (a channel's host is a worker); it may
import ``worker`` and every layer below.
"""

from .channel import Channel, create_channel_from_worker
from .channel_worker import ChannelWorker, WeightedItem

__all__ = ["Channel", "ChannelWorker", "WeightedItem", "create_channel_from_worker"]
