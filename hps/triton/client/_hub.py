"""The gevent hub that tritonclient's HTTP client leaves in each thread it is used in.

``tritonclient.http`` runs on geventhttpclient, which makes a gevent hub (an event loop
with an epoll descriptor and an eventfd) in every thread that sends a request. Nothing
destroys it when the thread ends, so code that makes a short-lived thread per request (a
``ThreadPoolExecutor`` per batch, say) leaks two descriptors per thread, until ``select()``
or the process's limit fails far from the cause. :func:`opened` and :func:`closed` count
the HTTP clients a thread has open; when the last one closes in a thread other than the
main one, the thread's hub goes with it. Under gevent's monkey-patching (Locust) every
greenlet shares the main hub, which is left alone.
"""

from __future__ import annotations

import threading

_local = threading.local()


def opened() -> None:
    """An HTTP client was made in this thread."""
    _local.open = getattr(_local, "open", 0) + 1


def closed() -> None:
    """An HTTP client made in this thread was closed: the thread's last one takes its hub."""
    _local.open = max(getattr(_local, "open", 1) - 1, 0)
    if _local.open or threading.current_thread() is threading.main_thread():
        return
    import gevent
    from gevent import monkey

    if monkey.is_module_patched("threading"):
        return
    # The thread's hub (a client never used makes one here, destroyed at once).
    gevent.get_hub().destroy(destroy_loop=True)
