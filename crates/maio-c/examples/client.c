/* A MAIO client in C, after the paper's section 4: connect, send pages
 * zero-copy (and one in copy mode), watch their state, receive the echo as a
 * scatter-gather list of pages, and check that misuse is refused.
 *
 *   gcc -Iinclude examples/client.c libmaio_c.a -lpthread -ldl -lm -o client
 *   ./client 127.0.0.1 7777
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "maio.h"

#define PAGES 8

static unsigned char pattern(int page, int i) { return (unsigned char)((page * 31 + i * 7) % 251); }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IP PORT\n", argv[0]);
        return 2;
    }
    struct iovec io_vec[16];
    void *cache = init_hp_memory(1);
    if (!cache) {
        fprintf(stderr, "init_hp_memory: %s\n", maio_last_error());
        return 1;
    }
    int idx = create_connected_socket(inet_addr(argv[1]), (uint16_t)atoi(argv[2]));
    if (idx < 0) {
        fprintf(stderr, "create_connected_socket: %s\n", maio_last_error());
        return 1;
    }
    if (init_tcp_ring(idx, cache) < 0) {
        fprintf(stderr, "init_tcp_ring: %s\n", maio_last_error());
        return 1;
    }

    size_t sent = 0;
    int in_flight_seen = 0;
    for (int p = 0; p < PAGES; p++) {
        unsigned char *buffer = alloc_page(cache);
        if (!buffer) {
            fprintf(stderr, "alloc_page: %s\n", maio_last_error());
            return 1;
        }
        for (int i = 0; i < MAIO_PAGE_SIZE; i++) buffer[i] = pattern(p, i);
        if (send_buffer(idx, buffer, MAIO_PAGE_SIZE, 0) < 0) {
            fprintf(stderr, "send_buffer: %s\n", maio_last_error());
            return 1;
        }
        sent += MAIO_PAGE_SIZE;
        if (get_buffer_state(buffer) == MAIO_IN_FLIGHT) in_flight_seen++;
        /* A page in flight cannot be freed. */
        if (get_buffer_state(buffer) == MAIO_IN_FLIGHT && free_page(cache, buffer) != -EBUSY) {
            fprintf(stderr, "freeing a page in flight was not refused\n");
            return 1;
        }
        int spins = 0;
        while (get_buffer_state(buffer) != MAIO_USER) {
            if (++spins > 5000) {
                fprintf(stderr, "page never came back from the kernel\n");
                return 1;
            }
            usleep(1000);
        }
        if (free_page(cache, buffer) != 0) {
            fprintf(stderr, "free_page: %s\n", maio_last_error());
            return 1;
        }
        if (free_page(cache, buffer) != -EALREADY) {
            fprintf(stderr, "double free was not refused\n");
            return 1;
        }
    }
    /* The standard (copy) mode for a small message. */
    unsigned char *small = alloc_page(cache);
    memcpy(small, "maio!", 5);
    if (send_buffer(idx, small, 5, MAIO_SEND_COPY) < 0) {
        fprintf(stderr, "send_buffer (copy): %s\n", maio_last_error());
        return 1;
    }
    sent += 5;
    int copied = maio_last_send_copied(idx);

    /* Pointers that are not pool pages are refused. */
    int on_stack;
    if (get_buffer_state(&on_stack) != -EINVAL || free_page(cache, &on_stack) != -EINVAL) {
        fprintf(stderr, "a foreign pointer was accepted\n");
        return 1;
    }

    size_t received = 0;
    int calls = 0, max_sg = 0;
    while (received < sent) {
        int n = tcp_receive_sg(idx, io_vec, 16, cache);
        if (n <= 0) {
            fprintf(stderr, "tcp_receive_sg returned %d: %s\n", n, maio_last_error());
            return 1;
        }
        calls++;
        if (n > max_sg) max_sg = n;
        for (int k = 0; k < n; k++) {
            unsigned char *b = io_vec[k].iov_base;
            if (get_buffer_state(b) != MAIO_RECEIVED) {
                fprintf(stderr, "a received page is not MAIO_RECEIVED\n");
                return 1;
            }
            for (size_t i = 0; i < io_vec[k].iov_len; i++, received++) {
                size_t at = received;
                unsigned char want = at < PAGES * MAIO_PAGE_SIZE
                                         ? pattern((int)(at / MAIO_PAGE_SIZE), (int)(at % MAIO_PAGE_SIZE))
                                         : (unsigned char)"maio!"[at - PAGES * MAIO_PAGE_SIZE];
                if (b[i] != want) {
                    fprintf(stderr, "byte %zu differs\n", at);
                    return 1;
                }
            }
            free_page(cache, b);
        }
    }
    printf("sent %zu bytes, received %zu bytes back in %d calls (up to %d pages each); "
           "%d pages seen in flight; copy-mode send copied=%d\n",
           sent, received, calls, max_sg, in_flight_seen, copied);
    return 0;
}
