"""DetokenizerManager (sglang/srt/managers/detokenizer_manager.py): token ids -> text."""

import ctypes
import os
import signal

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
         "zulu").split()


class DetokenizerManager:
    def __init__(self, recv_conn, send_conn):
        self.recv_from_scheduler = recv_conn
        self.send_to_tokenizer = send_conn

    def event_loop(self):
        while True:
            try:
                outs = self.recv_from_scheduler.recv()  # blocking, like zmq sock_recv
            except EOFError:
                os._exit(0)
            for o in outs:
                o["text"] = "".join(WORDS[i % len(WORDS)] + " " for i in o.pop("ids"))
            self.send_to_tokenizer.send(outs)


def run_detokenizer_process(server_args, port_args, recv_conn, send_conn):
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # die with the HTTP process
    except OSError:
        pass
    from setproctitle import setproctitle

    setproctitle("sglang::detokenizer")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    DetokenizerManager(recv_conn, send_conn).event_loop()
