"""base: what every layer stands on.

Configuration (``config``), errors, worker addresses and infos, the process's
worker context, the cluster secret and handshakes (``security``), payload
serialization, timing, hook points for the timeline (``hooks``), the process
lifecycle's registration points (``lifecycle``), logging and the progress
line.  It may import nothing of ``rlinf.scheduler`` outside ``base``.
"""
