//! Declarations of the rdma-core functions and of the C shim (src/shim.c) the provider calls.
//! rdma-core objects are opaque here: only the shim looks inside them.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    ibv_context,
    ibv_pd,
    ibv_mr,
    ibv_cq,
    ibv_comp_channel,
    ibv_qp,
    rdma_cm_id,
    rdma_event_channel
);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct is_sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct is_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    pub invalidated_rkey: u32,
    pub with_inv: u32,
    pub qp_num: u32,
}

#[repr(C)]
pub struct is_event {
    pub id: *mut rdma_cm_id,
    pub event: i32,
    pub status: i32,
    pub private_data_len: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub private_data: [u8; 256],
}

// Shim numbering (src/shim.c).
pub const IS_SEND: c_int = 0;
pub const IS_SEND_INV: c_int = 1;
pub const IS_WRITE: c_int = 2;
pub const IS_READ: c_int = 3;
pub const IS_WC_SUCCESS: u32 = 0;
pub const IS_WC_FLUSHED: u32 = 1;
pub const IS_WC_LOC_PROT: u32 = 2;
pub const IS_WC_LOC_LEN: u32 = 3;
pub const IS_WC_REM_ACCESS: u32 = 4;
pub const IS_WC_INVALID_REQ: u32 = 6;
pub const IS_OP_SEND: u32 = 0;
pub const IS_OP_WRITE: u32 = 1;
pub const IS_OP_READ: u32 = 2;

// enum rdma_cm_event_type and enum rdma_port_space (rdma/rdma_cma.h; part of librdmacm's ABI).
pub const EV_ADDR_RESOLVED: i32 = 0;
pub const EV_ROUTE_RESOLVED: i32 = 2;
pub const EV_CONNECT_REQUEST: i32 = 4;
pub const EV_REJECTED: i32 = 8;
pub const EV_ESTABLISHED: i32 = 9;
pub const EV_DISCONNECTED: i32 = 10;
pub const RDMA_PS_TCP: c_int = 0x0106;

opaque!(ibv_device);

extern "C" {
    pub fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device;
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
    pub fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd;
    pub fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    pub fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    pub fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel;
    pub fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int;
    pub fn ibv_create_cq(
        ctx: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;

    pub fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context;
    pub fn rdma_free_devices(list: *mut *mut ibv_context);
    pub fn rdma_create_event_channel() -> *mut rdma_event_channel;
    pub fn rdma_destroy_event_channel(ch: *mut rdma_event_channel);
    pub fn rdma_create_id(
        ch: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: c_int,
    ) -> c_int;
    pub fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    pub fn rdma_migrate_id(id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> c_int;
    pub fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
    pub fn rdma_destroy_qp(id: *mut rdma_cm_id);
    pub fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
    pub fn rdma_reject(id: *mut rdma_cm_id, pd: *const c_void, len: u8) -> c_int;

    pub fn is_post_send(
        qp: *mut ibv_qp,
        wr_id: u64,
        op: c_int,
        solicited: c_int,
        signaled: c_int,
        sges: *const is_sge,
        n: c_int,
        remote_addr: u64,
        rkey: u32,
        inv_rkey: u32,
    ) -> c_int;
    pub fn is_post_recv(qp: *mut ibv_qp, wr_id: u64, sges: *const is_sge, n: c_int) -> c_int;
    pub fn is_poll_cq(cq: *mut ibv_cq, out: *mut is_wc, n: c_int) -> c_int;
    pub fn is_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;
    pub fn is_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr;
    pub fn is_mr_keys(mr: *const ibv_mr, lkey: *mut u32, rkey: *mut u32);
    pub fn is_comp_channel_fd(ch: *const ibv_comp_channel) -> c_int;
    pub fn is_qp_state(qp: *mut ibv_qp) -> c_int;
    pub fn is_qp_num(qp: *mut ibv_qp) -> u32;
    pub fn is_ctx_name(ctx: *mut ibv_context) -> *const c_char;
    pub fn is_set_nonblock(fd: c_int) -> c_int;
    pub fn is_id_verbs(id: *const rdma_cm_id) -> *mut ibv_context;
    pub fn is_id_qp(id: *const rdma_cm_id) -> *mut ibv_qp;
    pub fn is_create_qp(
        id: *mut rdma_cm_id,
        pd: *mut ibv_pd,
        scq: *mut ibv_cq,
        rcq: *mut ibv_cq,
        max_send_wr: u32,
        max_recv_wr: u32,
        max_sge: u32,
    ) -> c_int;
    pub fn is_connect(id: *mut rdma_cm_id, pd: *const c_void, len: u8, ird: u8, ord: u8) -> c_int;
    pub fn is_accept(id: *mut rdma_cm_id, pd: *const c_void, len: u8, ird: u8, ord: u8) -> c_int;
    pub fn is_resolve_addr(
        id: *mut rdma_cm_id,
        family: c_int,
        ip: *const u8,
        port: u16,
        timeout_ms: c_int,
    ) -> c_int;
    pub fn is_bind_listen(
        id: *mut rdma_cm_id,
        family: c_int,
        ip: *const u8,
        port: u16,
        backlog: c_int,
    ) -> c_int;
    pub fn is_peer_addr(id: *mut rdma_cm_id, ip: *mut u8, port: *mut u16) -> c_int;
    pub fn is_local_addr(id: *mut rdma_cm_id, ip: *mut u8, port: *mut u16) -> c_int;
    pub fn is_next_event(
        ch: *mut rdma_event_channel,
        timeout_ms: c_int,
        out: *mut is_event,
    ) -> c_int;
    pub fn is_get_cq_event(ch: *mut ibv_comp_channel) -> c_int;
}
