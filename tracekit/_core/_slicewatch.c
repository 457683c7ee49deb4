/* The watchdog's poll, without the GIL (tracekit/_core/watchdog.py).
 *
 * A Python thread polling the loop thread every few milliseconds must take the GIL at each
 * poll; while it waits for it, every release of the GIL by the loop thread (each select/epoll
 * of each loop iteration) signals it: a futex wake-up system call on the loop thread and a
 * futile context switch on the watchdog's, thousands a second on a busy, healthy loop.
 *
 * Here the poll runs in C with the GIL released. Each watched loop thread publishes the start
 * of its open outermost slice (perf_counter ns, 0 when none) in an 8-byte cell (an
 * ``array('q')`` it writes with ``cell[0] = now``); ``wait`` sleeps, reads the cells, and
 * returns to Python only when a slice it has not reported yet (``seen``) has run past the
 * threshold, when ``control`` changes (a thread was watched, or stop was asked), or after
 * ``max_wait_ns``. The Python side then checks again under the GIL with tracekit's own clock
 * before sampling a stack.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static int64_t
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t
load(const Py_buffer *view, Py_ssize_t index)
{
    /* An aligned 8-byte load: the loop thread stores the cell with one aligned 8-byte store,
     * so the value read is the old one or the new one, never a mix. */
    return __atomic_load_n(((const int64_t *)view->buf) + index, __ATOMIC_RELAXED);
}

static int
get_cell(PyObject *obj, Py_buffer *view, Py_ssize_t min_items, int flags)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | flags) < 0)
        return -1;
    if (view->itemsize != 8 || view->format == NULL || strcmp(view->format, "q") != 0
            || view->len < min_items * 8
            || (view->len > 0 && ((uintptr_t)view->buf & 7) != 0)) {  /* (an empty array's
               buffer is a static byte: never read, whatever its alignment) */
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "expected an array('q') with enough items");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(wait_doc,
"wait(cells, seen, control, threshold_ns, interval_ns, max_wait_ns) -> list[int]\n\n"
"Sleep in steps of interval_ns with the GIL released until cells[i][0] holds a slice start\n"
"at least threshold_ns old and other than seen[i] (returns the indexes of such cells, and\n"
"sets their seen[i] to that start), control[0] becomes non-zero (stop), control[1]\n"
"changes, or max_wait_ns pass (returns []).");

static PyObject *
slicewatch_wait(PyObject *self, PyObject *args)
{
    PyObject *cells, *seen, *control;
    long long threshold, interval, max_wait;
    if (!PyArg_ParseTuple(args, "O!OOLLL:wait", &PyTuple_Type, &cells, &seen, &control,
                          &threshold, &interval, &max_wait))
        return NULL;
    if (interval <= 0 || threshold < 0 || max_wait < 0) {
        PyErr_SetString(PyExc_ValueError, "wait: negative time or zero interval");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(cells);
    Py_buffer control_view, seen_view;
    if (get_cell(control, &control_view, 2, 0) < 0)
        return NULL;
    if (get_cell(seen, &seen_view, count, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&control_view);
        return NULL;
    }
    Py_buffer *views = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer));
    if (views == NULL) {
        PyBuffer_Release(&control_view);
        PyBuffer_Release(&seen_view);
        return PyErr_NoMemory();
    }
    Py_ssize_t got = 0;
    for (; got < count; got++)
        if (get_cell(PyTuple_GET_ITEM(cells, got), &views[got], 1, 0) < 0)
            break;
    PyObject *result = NULL;
    if (got == count) {
        int64_t *over = PyMem_Calloc(count ? count : 1, sizeof(int64_t));
        if (over == NULL) {
            PyErr_NoMemory();
        } else {
            Py_ssize_t found = 0;
            int64_t generation = load(&control_view, 1);
            Py_BEGIN_ALLOW_THREADS
            int64_t deadline = monotonic_ns() + max_wait;
            struct timespec step = {interval / 1000000000, interval % 1000000000};
            for (;;) {
                struct timespec left = step;
                while (nanosleep(&left, &left) != 0 && errno == EINTR)
                    ;
                if (load(&control_view, 0) != 0 || load(&control_view, 1) != generation)
                    break;
                int64_t now = monotonic_ns();
                for (Py_ssize_t i = 0; i < count; i++) {
                    int64_t start = load(&views[i], 0);
                    if (start > 0 && now - start >= threshold
                            && start != ((int64_t *)seen_view.buf)[i]) {
                        ((int64_t *)seen_view.buf)[i] = start;
                        over[found++] = i;
                    }
                }
                if (found || now >= deadline)
                    break;
            }
            Py_END_ALLOW_THREADS
            result = PyList_New(found);
            for (Py_ssize_t i = 0; result != NULL && i < found; i++) {
                PyObject *index = PyLong_FromSsize_t((Py_ssize_t)over[i]);
                if (index == NULL)
                    Py_CLEAR(result);
                else
                    PyList_SET_ITEM(result, i, index);
            }
            PyMem_Free(over);
        }
    }
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyBuffer_Release(&control_view);
    PyBuffer_Release(&seen_view);
    return result;
}

PyDoc_STRVAR(now_doc, "now_ns() -> int: the clock wait() compares cells with (CLOCK_MONOTONIC).");

static PyObject *
slicewatch_now_ns(PyObject *self, PyObject *unused)
{
    return PyLong_FromLongLong(monotonic_ns());
}

static PyMethodDef methods[] = {
    {"wait", slicewatch_wait, METH_VARARGS, wait_doc},
    {"now_ns", slicewatch_now_ns, METH_NOARGS, now_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tracekit._core._slicewatch",
    "The watchdog's poll, without the GIL (see tracekit/_core/watchdog.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__slicewatch(void)
{
    return PyModule_Create(&module);
}
