//! A minimal HTTP/1.0 GET with connect/total timeouts and a body cap, for loopback endpoints.
