/*
 * maio.h: the C interface of MAIO (fastpath), with the paper's names.
 *
 * Memory comes from a pool of 2 MiB hugepages carved into 4 KiB I/O pages;
 * sockets are registered with an io_uring whose kernel thread polls for
 * submissions (no system call per send); sends are zero-copy from the pool,
 * receives land in pool pages lent to the kernel.
 *
 * Every function that can fail returns NULL or a negative errno value;
 * maio_last_error() then describes the problem and what to do about it.
 * Functions are thread-safe (one internal lock).
 *
 * Link: -lmaio_c (static: also -lpthread -ldl -lm).
 */
#ifndef MAIO_H
#define MAIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Size of one I/O page. */
#define MAIO_PAGE_SIZE 4096

/* Buffer states (get_buffer_state). */
enum maio_buffer_state {
    MAIO_FREE = 0,      /* in the pool */
    MAIO_USER = 1,      /* the application's */
    MAIO_IN_FLIGHT = 2, /* the kernel's: being sent; do not touch or free */
    MAIO_RECEIVED = 3,  /* filled by the kernel, handed to the application */
};

/* send_buffer flags. */
#define MAIO_SEND_COPY 1 /* copy the bytes (the standard mode, for small sends) */

/* Map page_cnt 2 MiB hugepages (falling back to transparent hugepages with a
 * warning) and return the opaque cache handle, or NULL. One per process. */
void *init_hp_memory(int page_cnt);

/* One 4 KiB I/O page (state MAIO_USER), or NULL when the pool is exhausted. */
void *alloc_page(void *cache);

/* Give a page back: a user page to the pool, a received page to the kernel's
 * receive ring. 0, or -EINVAL (not a pool page), -EALREADY (double free),
 * -EBUSY (in flight). */
int free_page(void *cache, void *page);

/* Create a TCP socket and connect it to dip (network byte order, as
 * in_addr.s_addr) and port (host byte order). Returns a MAIO socket index
 * (not a file descriptor), or a negative errno. */
int create_connected_socket(uint32_t dip, uint16_t port);

/* Attach socket idx to the cache's asynchronous ring. 0 or negative errno. */
int init_tcp_ring(int idx, void *cache);

/* Post len bytes of buffer (a page from alloc_page) for sending on idx.
 * Zero-copy: the page is MAIO_IN_FLIGHT until the kernel is done with it,
 * then MAIO_USER again. With MAIO_SEND_COPY the bytes are copied and the page
 * stays the caller's. 0 or negative errno. */
int send_buffer(int idx, void *buffer, size_t len, int flags);

/* The page's state (enum maio_buffer_state), or -EINVAL. Also collects
 * completions, so polling it makes progress. */
int get_buffer_state(void *buffer);

/* Wait (up to 5 s) for received data on idx and describe up to n pages of it
 * in io_vec. Returns the number of entries filled, 0 at end of stream, or a
 * negative errno (-EAGAIN: nothing arrived in time). Each page is
 * MAIO_RECEIVED until given back with free_page. */
int tcp_receive_sg(int idx, struct iovec *io_vec, int n, void *cache);

/* Was the last zero-copy send completed by a copy in the kernel (for example
 * to a local peer)? 1, 0, or -EINVAL. */
int maio_last_send_copied(int idx);

/* A description of the last error in this thread ("" if none). */
const char *maio_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MAIO_H */
