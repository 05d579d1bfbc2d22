"""Host instances: dequeuing threads that claim queue entries under a lease and hand
them to services (DESIGN.md §8). Not built yet: the queues are filled by
``MessageBox.publish`` and read with ``MessageBox.queue_depth``."""
