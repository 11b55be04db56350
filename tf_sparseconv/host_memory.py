"""The host memory a new allocation can have now, for checking sizes a user gives before
anything is allocated: on a host that overcommits memory an allocation far beyond it does
not fail (no MemoryError) but gets the process killed once its pages are touched."""
import os


def available_memory_bytes():
    """Linux's MemAvailable; else the free physical pages; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _size(n):
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_fits(need_bytes, what):
    """MemoryError saying what needs how much where need_bytes exceeds the memory available."""
    available = available_memory_bytes()
    if available is not None and need_bytes > available:
        raise MemoryError(f"{what} take {_size(need_bytes)}, {_size(available)} are available")


def check_cloud_fits(points):
    """check_fits for sampling one cloud of `points` points, which holds at least its float64
    coordinates [points, 3]."""
    check_fits(points * 3 * 8, "one cloud's coordinates alone")
