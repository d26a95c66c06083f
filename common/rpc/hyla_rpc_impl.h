/* hyla_rpc_impl.h — internals shared by hyla_rpc_server.c, hyla_rpc_client.c and
 * hyla_rpc_common.c. Not a public header: nothing outside common/rpc/ includes it.
 *
 * Tags. Every grpc_call_start_batch / request_call names a rpc_tag embedded in the object it
 * concerns; a loop thread dispatches a completion by tag->kind to that object's handler. An
 * object has at most one batch in flight per tag, so a tag is never posted twice at once. */
#ifndef HYLA_RPC_IMPL_H
#define HYLA_RPC_IMPL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <pthread.h>

#include "hyla_rpc.h"

enum {
    RPC_TAG_ACCEPT = 1,   /* server: request_call completed (a new call, or shutdown) */
    RPC_TAG_RECV,         /* recv message (client: + recv initial metadata the first time) */
    RPC_TAG_SEND,         /* send message / send status / send close */
    RPC_TAG_CLOSE,        /* server: recv close on server; client: recv status on client */
    RPC_TAG_START,        /* client: send initial metadata */
    RPC_TAG_SHUTDOWN,     /* server: grpc_server_shutdown_and_notify */
};

typedef struct {
    int kind;
    void *owner;
} rpc_tag;

/* A queued outgoing message. */
typedef struct rpc_out {
    struct rpc_out *next;
    grpc_byte_buffer *bb;
} rpc_out;

/* Owned copy of a metadata pair. */
typedef struct {
    char *key, *value;
} rpc_kv;

/* grpc_init / grpc_shutdown around every server and client (gRPC counts them). */
void rpc_grpc_ref(void);
void rpc_grpc_unref(void);

/* Set on the loop threads so blocking calls there can be caught. */
extern _Thread_local int rpc_on_loop_thread;

/* Pack msg into a byte buffer. Fails with HYLA_ERR_RESOURCE (naming `what`, the size and the
 * limit) when the packed size exceeds max_bytes. *out: caller frees with grpc_byte_buffer_destroy. */
hyla_status rpc_pack(const ProtobufCMessage *msg, int max_bytes, const char *what, grpc_byte_buffer **out);
/* Raw bytes into a byte buffer (copied). Same limit check. */
hyla_status rpc_pack_raw(const void *data, size_t len, int max_bytes, const char *what,
                         grpc_byte_buffer **out);
/* Decode a byte buffer; NULL when the bytes are not a valid desc message. Caller frees with
 * protobuf_c_message_free_unpacked. */
ProtobufCMessage *rpc_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb, size_t *len_out);

/* Deadline in ms from now (<= 0: infinite). */
gpr_timespec rpc_deadline_from_ms(int64_t ms);
/* Copy a slice into a new NUL-terminated string (caller frees with free()). */
char *rpc_slice_strdup(grpc_slice s);
/* A queue of messages (head, tail, length): append bb (takes ownership); take the head's
 * buffer (NULL when empty; caller destroys it); free all; free all but the head (the message a
 * send batch has in flight). */
void rpc_out_push(rpc_out **head, rpc_out **tail, size_t *len, grpc_byte_buffer *bb);
grpc_byte_buffer *rpc_out_pop(rpc_out **head, rpc_out **tail, size_t *len);
void rpc_out_free_all(rpc_out **head, rpc_out **tail, size_t *len);
void rpc_out_free_after_head(rpc_out **head, rpc_out **tail, size_t *len);
/* Copy n metadata pairs into *out (caller frees with rpc_kv_free). */
hyla_status rpc_kv_copy(const grpc_metadata *md, size_t n, rpc_kv **out, size_t *n_out);
void rpc_kv_free(rpc_kv *kv, size_t n);
/* Free the strings of n pairs but not the array: a fixed array of pairs (server trailers) is
 * released as a copied one is. */
void rpc_kv_clear(rpc_kv *kv, size_t n);
const char *rpc_kv_find(const rpc_kv *kv, size_t n, const char *key);

/* Channel args capping received and sent messages at max_bytes, in args[2] (borrowed by the
 * result): client channels and servers set the same two limits. */
grpc_channel_args rpc_message_size_args(grpc_arg args[2], int max_bytes);
/* The next completed batch of cq: 1 with its tag and success flag, 0 once cq is shut down; the
 * wait of every completion-queue loop thread. */
int rpc_cq_next(grpc_completion_queue *cq, rpc_tag **tag, int *ok);

/* Start a batch; a refusal by gRPC is a bug of this module: logged, returns non-zero. */
int rpc_start_batch(grpc_call *call, const grpc_op *ops, size_t n, rpc_tag *tag, const char *what);

/* The process's security (hyla_rpc_security.c): credentials for a new listener or channel
 * (caller releases them), and the default bearer key (NULL: none). */
grpc_server_credentials *rpc_server_credentials(void);
grpc_channel_credentials *rpc_channel_credentials(void);
/* TLS channel credentials verifying servers with the CA in PEM file ca_path (client certificate:
 * the process's, if any). HYLA_ERR_IO naming the file when it cannot be read. */
hyla_status rpc_channel_credentials_ca(const char *ca_path, grpc_channel_credentials **out);
const char *rpc_default_bearer(void);

#endif
