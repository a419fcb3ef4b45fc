"""DetokenizerManager (sglang/srt/managers/detokenizer_manager.py): token ids -> text.

Real SGLang: the scheduler pushes BatchTokenIDOutput over ZMQ (SNDHWM 0: unbounded, so a
detokenizer that stops reading never blocks the scheduler; ZMQ's I/O thread queues the
batches), `event_loop` receives each, `handle_batch_token_id_out` decodes it with the
tokenizer, and the result goes on to the tokenizer manager in the HTTP process.

Fault: LAB_FAULT_DETOKENIZER_STUCK_AFTER=k -- after forwarding k batches the detokenizer
hangs inside `handle_batch_token_id_out` (a tokenizer decode that never returns) and no output
reaches the HTTP server again, while the scheduler keeps generating: a receiver thread keeps
draining the scheduler's pipe, as ZMQ's I/O thread does.
"""

import ctypes
import os
import queue
import signal
import threading

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
         "zulu").split()


def _env_int(name):
    try:
        return int(os.environ.get(name, "").strip())
    except ValueError:
        return None


class DetokenizerManager:
    def __init__(self, recv_conn, send_conn):
        self.recv_from_scheduler = recv_conn
        self.send_to_tokenizer = send_conn
        self.stuck_after = _env_int("LAB_FAULT_DETOKENIZER_STUCK_AFTER")
        self.forwarded = 0
        self.inbox = None
        if self.stuck_after is not None:
            self.inbox = queue.Queue()
            threading.Thread(target=self._zmq_io_thread, name="zmq_io", daemon=True).start()

    def _zmq_io_thread(self):
        while True:
            try:
                self.inbox.put(self.recv_from_scheduler.recv())
            except EOFError:
                os._exit(0)

    def recv_pyobj(self):
        if self.inbox is not None:
            return self.inbox.get()
        try:
            return self.recv_from_scheduler.recv()  # blocking, like zmq sock_recv
        except EOFError:
            os._exit(0)

    def event_loop(self):
        while True:
            outs = self.recv_pyobj()
            self.send_to_tokenizer.send(self.handle_batch_token_id_out(outs))
            self.forwarded += 1

    def handle_batch_token_id_out(self, outs):
        if self.stuck_after is not None and self.forwarded >= self.stuck_after:
            self._batch_decode_hung()
        for o in outs:
            o["text"] = "".join(WORDS[i % len(WORDS)] + " " for i in o.pop("ids"))
        return outs

    def _batch_decode_hung(self):
        threading.Event().wait()  # the tokenizer decode that never returns


def run_detokenizer_process(server_args, port_args, recv_conn, send_conn):
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # die with the HTTP process
    except OSError:
        pass
    from setproctitle import setproctitle

    setproctitle("sglang::detokenizer")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    DetokenizerManager(recv_conn, send_conn).event_loop()
