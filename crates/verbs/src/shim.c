/* A narrow C boundary between the verbs provider and rdma-core. libibverbs implements its data
 * path (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) and ibv_reg_mr as inline
 * functions or macros over structures whose layout only the C headers know; these wrappers give
 * Rust plain functions over opaque pointers and small flat structs defined here. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

struct is_sge {
	uint64_t addr;
	uint32_t len;
	uint32_t lkey;
};

struct is_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t invalidated_rkey;
	uint32_t with_inv;
	uint32_t qp_num;
};

struct is_event {
	struct rdma_cm_id *id;
	int32_t event;
	int32_t status;
	uint32_t private_data_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t private_data[256];
};

enum { IS_SEND = 0, IS_SEND_INV = 1, IS_WRITE = 2, IS_READ = 3 };

#define IS_MAX_SGE 32

static int fill_sges(struct ibv_sge *out, const struct is_sge *in, int n)
{
	int i;
	if (n < 0 || n > IS_MAX_SGE)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		out[i].addr = in[i].addr;
		out[i].length = in[i].len;
		out[i].lkey = in[i].lkey;
	}
	return 0;
}

int is_post_send(struct ibv_qp *qp, uint64_t wr_id, int op, int solicited, int signaled,
		 const struct is_sge *sges, int n, uint64_t remote_addr, uint32_t rkey,
		 uint32_t inv_rkey)
{
	struct ibv_sge sg[IS_MAX_SGE];
	struct ibv_send_wr wr, *bad = NULL;
	int rc = fill_sges(sg, sges, n);
	if (rc)
		return rc;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = sg;
	wr.num_sge = n;
	wr.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (solicited ? IBV_SEND_SOLICITED : 0);
	switch (op) {
	case IS_SEND:
		wr.opcode = IBV_WR_SEND;
		break;
	case IS_SEND_INV:
		wr.opcode = IBV_WR_SEND_WITH_INV;
		wr.invalidate_rkey = inv_rkey;
		/* rdma-core's siw provider (push_send_wqe, rdma-core 44) copies wr.rdma.rkey into the
		 * work queue entry for every opcode and never reads invalidate_rkey, so the kernel
		 * would invalidate STag 0 and the peer's receive fail with "remote invalid request".
		 * A Send does not use wr.rdma, so naming the STag there too costs other providers
		 * nothing. */
		wr.wr.rdma.rkey = inv_rkey;
		break;
	case IS_WRITE:
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = remote_addr;
		wr.wr.rdma.rkey = rkey;
		break;
	case IS_READ:
		wr.opcode = IBV_WR_RDMA_READ;
		wr.wr.rdma.remote_addr = remote_addr;
		wr.wr.rdma.rkey = rkey;
		break;
	default:
		return -EINVAL;
	}
	rc = ibv_post_send(qp, &wr, &bad);
	return rc > 0 ? -rc : rc;
}

int is_post_recv(struct ibv_qp *qp, uint64_t wr_id, const struct is_sge *sges, int n)
{
	struct ibv_sge sg[IS_MAX_SGE];
	struct ibv_recv_wr wr, *bad = NULL;
	int rc = fill_sges(sg, sges, n);
	if (rc)
		return rc;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = sg;
	wr.num_sge = n;
	rc = ibv_post_recv(qp, &wr, &bad);
	return rc > 0 ? -rc : rc;
}

/* Completion status and opcode in the provider's own small numbering (IS_WC_*), so the Rust side
 * never depends on libibverbs' enum values. */
enum { IS_WC_SUCCESS, IS_WC_FLUSHED, IS_WC_LOC_PROT, IS_WC_LOC_LEN, IS_WC_REM_ACCESS, IS_WC_REM_OP,
       IS_WC_INVALID_REQ };
enum { IS_OP_SEND, IS_OP_WRITE, IS_OP_READ, IS_OP_RECV, IS_OP_OTHER };

static uint32_t map_status(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_SUCCESS: return IS_WC_SUCCESS;
	case IBV_WC_WR_FLUSH_ERR: return IS_WC_FLUSHED;
	case IBV_WC_LOC_PROT_ERR: return IS_WC_LOC_PROT;
	case IBV_WC_LOC_LEN_ERR: return IS_WC_LOC_LEN;
	case IBV_WC_REM_ACCESS_ERR: return IS_WC_REM_ACCESS;
	case IBV_WC_LOC_QP_OP_ERR:
	case IBV_WC_REM_INV_REQ_ERR: return IS_WC_INVALID_REQ;
	default: return IS_WC_REM_OP;
	}
}

static uint32_t map_opcode(enum ibv_wc_opcode o)
{
	if (o & IBV_WC_RECV)
		return IS_OP_RECV;
	switch (o) {
	case IBV_WC_SEND: return IS_OP_SEND;
	case IBV_WC_RDMA_WRITE: return IS_OP_WRITE;
	case IBV_WC_RDMA_READ: return IS_OP_READ;
	default: return IS_OP_OTHER;
	}
}

int is_poll_cq(struct ibv_cq *cq, struct is_wc *out, int n)
{
	struct ibv_wc wc[16];
	int got, i;
	if (n > 16)
		n = 16;
	got = ibv_poll_cq(cq, n, wc);
	for (i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = map_status(wc[i].status);
		out[i].opcode = map_opcode(wc[i].opcode);
		out[i].byte_len = wc[i].byte_len;
		out[i].with_inv = (wc[i].wc_flags & IBV_WC_WITH_INV) != 0;
		out[i].invalidated_rkey = out[i].with_inv ? wc[i].invalidated_rkey : 0;
		out[i].qp_num = wc[i].qp_num;
	}
	return got;
}

int is_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

struct ibv_mr *is_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return ibv_reg_mr(pd, addr, len, access);
}

void is_mr_keys(const struct ibv_mr *mr, uint32_t *lkey, uint32_t *rkey)
{
	*lkey = mr->lkey;
	*rkey = mr->rkey;
}

int is_comp_channel_fd(const struct ibv_comp_channel *ch)
{
	return ch->fd;
}

/* 0 = not connected yet (reset/init/rtr), 1 = RTS, 2 = draining (SQD/SQE), 3 = error, -1 = unknown. */
int is_qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init))
		return -1;
	switch (attr.qp_state) {
	case IBV_QPS_RESET:
	case IBV_QPS_INIT:
	case IBV_QPS_RTR: return 0;
	case IBV_QPS_RTS: return 1;
	case IBV_QPS_SQD:
	case IBV_QPS_SQE: return 2;
	case IBV_QPS_ERR: return 3;
	default: return -1;
	}
}

uint32_t is_qp_num(const struct ibv_qp *qp)
{
	return qp->qp_num;
}

const char *is_ctx_name(struct ibv_context *ctx)
{
	return ibv_get_device_name(ctx->device);
}

int is_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

struct ibv_context *is_id_verbs(const struct rdma_cm_id *id)
{
	return id->verbs;
}

struct ibv_qp *is_id_qp(const struct rdma_cm_id *id)
{
	return id->qp;
}

int is_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		 uint32_t max_send_wr, uint32_t max_recv_wr, uint32_t max_sge)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = max_sge;
	return rdma_create_qp(id, pd, &a) ? -errno : 0;
}

static void conn_param(struct rdma_conn_param *p, const void *pd, uint8_t len, uint8_t ird,
		       uint8_t ord)
{
	memset(p, 0, sizeof(*p));
	p->private_data = len ? pd : NULL;
	p->private_data_len = len;
	p->responder_resources = ird;
	p->initiator_depth = ord;
	p->retry_count = 7;
	p->rnr_retry_count = 7;
}

int is_connect(struct rdma_cm_id *id, const void *pd, uint8_t len, uint8_t ird, uint8_t ord)
{
	struct rdma_conn_param p;
	conn_param(&p, pd, len, ird, ord);
	return rdma_connect(id, &p) ? -errno : 0;
}

int is_accept(struct rdma_cm_id *id, const void *pd, uint8_t len, uint8_t ird, uint8_t ord)
{
	struct rdma_conn_param p;
	conn_param(&p, pd, len, ird, ord);
	return rdma_accept(id, &p) ? -errno : 0;
}

static socklen_t make_addr(struct sockaddr_storage *ss, int family, const uint8_t *ip, uint16_t port)
{
	memset(ss, 0, sizeof(*ss));
	if (family == 6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
		memcpy(&s6->sin6_addr, ip, 16);
		return sizeof(*s6);
	}
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	s4->sin_family = AF_INET;
	s4->sin_port = htons(port);
	memcpy(&s4->sin_addr, ip, 4);
	return sizeof(*s4);
}

int is_resolve_addr(struct rdma_cm_id *id, int family, const uint8_t *ip, uint16_t port, int timeout_ms)
{
	struct sockaddr_storage ss;
	make_addr(&ss, family, ip, port);
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, timeout_ms) ? -errno : 0;
}

int is_bind_listen(struct rdma_cm_id *id, int family, const uint8_t *ip, uint16_t port, int backlog)
{
	struct sockaddr_storage ss;
	make_addr(&ss, family, ip, port);
	if (rdma_bind_addr(id, (struct sockaddr *)&ss))
		return -errno;
	return rdma_listen(id, backlog) ? -errno : 0;
}

/* Writes the address into ip (4 or 16 bytes) and *port; returns 4, 6 or 0 (unknown). */
static int read_addr(const struct sockaddr *sa, uint8_t *ip, uint16_t *port)
{
	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
		memcpy(ip, &s4->sin_addr, 4);
		*port = ntohs(s4->sin_port);
		return 4;
	}
	if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
		memcpy(ip, &s6->sin6_addr, 16);
		*port = ntohs(s6->sin6_port);
		return 6;
	}
	return 0;
}

int is_peer_addr(struct rdma_cm_id *id, uint8_t *ip, uint16_t *port)
{
	return read_addr(rdma_get_peer_addr(id), ip, port);
}

int is_local_addr(struct rdma_cm_id *id, uint8_t *ip, uint16_t *port)
{
	return read_addr(rdma_get_local_addr(id), ip, port);
}

/* Waits up to timeout_ms for the next event on ch, copies what the provider needs and acks it.
 * 0 on success, -ETIMEDOUT, or -errno. */
int is_next_event(struct rdma_event_channel *ch, int timeout_ms, struct is_event *out)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int n = poll(&p, 1, timeout_ms);
	if (n < 0)
		return -errno;
	if (n == 0)
		return -ETIMEDOUT;
	if (rdma_get_cm_event(ch, &ev))
		return -errno;
	memset(out, 0, sizeof(*out));
	out->id = ev->id;
	out->event = ev->event;
	out->status = ev->status;
	if (ev->id && ev->id->ps == RDMA_PS_TCP) {
		uint32_t len = ev->param.conn.private_data_len;
		if (len > sizeof(out->private_data))
			len = sizeof(out->private_data);
		if (ev->param.conn.private_data && len)
			memcpy(out->private_data, ev->param.conn.private_data, len);
		out->private_data_len = len;
		out->responder_resources = ev->param.conn.responder_resources;
		out->initiator_depth = ev->param.conn.initiator_depth;
	}
	rdma_ack_cm_event(ev);
	return 0;
}

/* Consumes one completion event from the channel if there is one (the fd must be non-blocking
 * or readable); acks it. 1 if one was consumed, 0 if none, -errno on error. */
int is_get_cq_event(struct ibv_comp_channel *ch)
{
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx))
		return errno == EAGAIN ? 0 : -errno;
	ibv_ack_cq_events(cq, 1);
	return 1;
}
