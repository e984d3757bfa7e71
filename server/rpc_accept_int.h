/*
 * kvdepotd's own TCP acceptor for plain-TCP gRPC (server.tcp_address
 * without TLS). gRPC's listener gives the daemon no way to end one
 * connection, so a caller that opens and cancels calls faster than the
 * daemon answers them (HTTP/2 rapid reset), or sends call after call
 * without a valid token, made the core queue every call it parsed: about
 * 8 KiB each, 800 MiB for 100,000. This acceptor accepts the connections
 * itself and hands each to the gRPC server (grpc_server_add_channel_from_fd),
 * so its calls carry the peer "fd:N"; rpc.c reports each call that a
 * connection wastes (refused, or cancelled before its message arrived) and
 * a connection that wastes more than RPC_CONN_STRIKES in one second is shut
 * down, which frees what the core holds for it. So is a connection that
 * makes no admitted call within server.handshake_timeout of its accept.
 *
 * Threading: one thread accepts; rpc_accept_strike() may be called from any
 * thread. Lifetimes: rpc_accept_open() before grpc_server_start(),
 * rpc_accept_start() after it, rpc_accept_stop() before the server shuts
 * down; the accepted descriptors belong to gRPC once handed over.
 */
#ifndef KVDEPOT_SERVER_RPC_ACCEPT_INT_H
#define KVDEPOT_SERVER_RPC_ACCEPT_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <grpc/grpc.h>

#include "kvdepot/common.h"

/* Wasted calls one connection may make in one second before it is shut. */
#define RPC_CONN_STRIKES 16

typedef struct rpc_accept rpc_accept_t;

/* Binds and listens on `address` ("host:port", "[v6]:port" or ":port"; port
 * 0 picks one), writes the port to *port_out. KVD_ERR_INVALID for an
 * address it cannot parse, KVD_ERR_UNREACHABLE when it cannot bind (the
 * reason in err). */
kvd_status_t rpc_accept_open(const char *address, rpc_accept_t **out,
                             int *port_out, char *err, size_t err_len);

/* Starts the thread that hands every accepted connection to `server`; a
 * connection with no admitted call `deadline_ms` after its accept is shut. */
kvd_status_t rpc_accept_start(rpc_accept_t *a, grpc_server *server,
                              int deadline_ms);

/* The connection of `peer` made an admitted call: the deadline of
 * rpc_accept_start() no longer applies to it. Other peers are ignored. */
void rpc_accept_admit(rpc_accept_t *a, const char *peer);

/* One wasted call on the connection of `peer` (a call's
 * grpc_call_get_peer); true when it was the one that shut the connection.
 * Peers that are not this acceptor's ("unix:...") are ignored. */
bool rpc_accept_strike(rpc_accept_t *a, const char *peer);

/* Stops accepting and joins the thread; the connections stay gRPC's. */
void rpc_accept_stop(rpc_accept_t *a);

/* Frees what rpc_accept_open() made (after rpc_accept_stop()); NULL is a
 * no-op. */
void rpc_accept_free(rpc_accept_t *a);

#endif
