"""The run's doors: frame and audio sources, capture workers, sinks (files, video, the web preview, MQTT) and the
URI reading they share. Model pre/post-processing stays in :mod:`edgert.vision`.

Importing this package needs numpy alone; OpenCV, PyAV, GStreamer and paho-mqtt are imported when a door opens.
"""
