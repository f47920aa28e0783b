/*
 * ngx_http_ratewell_module: ratewell's decisions in nginx's preaccess phase, on the engine's
 * shared key table in an nginx shared zone, exact across every worker.
 *
 * The decisions are the Rust half's (libratewell_nginx.a, include/ratewell_nginx.h): this file
 * parses the directives, lays the table out in the zone, opens it in each worker, computes each
 * request's keys and answers with the status and fields the decision gives.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ratewell_nginx.h"


#define NGX_HTTP_RATEWELL_ERR_LEN  512


/* What the zone keeps across reloads: where the table is in it. */
typedef struct {
    void                        *region;
    size_t                       len;
    size_t                       capacity;
} ngx_http_ratewell_shctx_t;


/* One ratewell_zone: its key, policy and table. */
typedef struct {
    ngx_http_complex_value_t     key;
    ngx_str_t                    name;
    ngx_str_t                    policy;
    ngx_uint_t                   refuse;
    ngx_shm_zone_t              *shm_zone;
    ngx_http_ratewell_shctx_t   *sh;
    /* This worker's handle on the table, and the zone's RateLimit-Policy field. */
    ratewell_zone               *zone;
    ngx_str_t                    policy_field;
} ngx_http_ratewell_ctx_t;


typedef struct {
    ngx_shm_zone_t              *shm_zone;
} ngx_http_ratewell_limit_t;


typedef struct {
    ngx_array_t                  zones;     /* of ngx_http_ratewell_ctx_t * */
} ngx_http_ratewell_main_conf_t;


typedef struct {
    ngx_array_t                 *limits;    /* of ngx_http_ratewell_limit_t */
    ngx_uint_t                   status;
    ngx_uint_t                   log_level;
    ngx_flag_t                   headers;
} ngx_http_ratewell_loc_conf_t;


/* Kept on the main request once it is decided (its context, and a pool cleanup, which an
 * internal redirect keeps where it clears the context): a request is decided once, whatever
 * redirects and subrequests it makes. */
typedef struct {
    ngx_uint_t                   admitted;
} ngx_http_ratewell_req_t;


static ngx_int_t ngx_http_ratewell_handler(ngx_http_request_t *r);
static void ngx_http_ratewell_cleanup(void *data);
static ngx_int_t ngx_http_ratewell_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static void *ngx_http_ratewell_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_ratewell_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_ratewell_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_ratewell_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_ratewell(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_int_t ngx_http_ratewell_init(ngx_conf_t *cf);
static ngx_int_t ngx_http_ratewell_init_process(ngx_cycle_t *cycle);
static void ngx_http_ratewell_exit_process(ngx_cycle_t *cycle);


static ngx_conf_enum_t  ngx_http_ratewell_log_levels[] = {
    { ngx_string("info"), NGX_LOG_INFO },
    { ngx_string("notice"), NGX_LOG_NOTICE },
    { ngx_string("warn"), NGX_LOG_WARN },
    { ngx_string("error"), NGX_LOG_ERR },
    { ngx_null_string, 0 }
};


static ngx_conf_num_bounds_t  ngx_http_ratewell_status_bounds = {
    ngx_conf_check_num_bounds, 400, 599
};


static ngx_command_t  ngx_http_ratewell_commands[] = {

    { ngx_string("ratewell_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_2MORE,
      ngx_http_ratewell_zone,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("ratewell"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_ratewell,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("ratewell_status"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, status),
      &ngx_http_ratewell_status_bounds },

    { ngx_string("ratewell_log_level"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, log_level),
      &ngx_http_ratewell_log_levels },

    { ngx_string("ratewell_headers"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, headers),
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_ratewell_module_ctx = {
    NULL,                                  /* preconfiguration */
    ngx_http_ratewell_init,                /* postconfiguration */

    ngx_http_ratewell_create_main_conf,    /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_ratewell_create_loc_conf,     /* create location configuration */
    ngx_http_ratewell_merge_loc_conf       /* merge location configuration */
};


ngx_module_t  ngx_http_ratewell_module = {
    NGX_MODULE_V1,
    &ngx_http_ratewell_module_ctx,         /* module context */
    ngx_http_ratewell_commands,            /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_ratewell_init_process,        /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_ratewell_exit_process,        /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_str_t  ngx_http_ratewell_retry_after = ngx_string("Retry-After");
static ngx_str_t  ngx_http_ratewell_policy_name = ngx_string("RateLimit-Policy");
static ngx_str_t  ngx_http_ratewell_field_name = ngx_string("RateLimit");


static ngx_int_t
ngx_http_ratewell_add_header(ngx_http_request_t *r, ngx_str_t *name,
    u_char *value, size_t len)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key = *name;
    h->value.data = value;
    h->value.len = len;
    h->lowcase_key = NULL;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    return NGX_OK;
}


/* Nothing to free: the cleanup marks the request as decided. */
static void
ngx_http_ratewell_cleanup(void *data)
{
}


static ngx_http_ratewell_req_t *
ngx_http_ratewell_decided(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t       *cln;
    ngx_http_ratewell_req_t  *req;

    req = ngx_http_get_module_ctx(r, ngx_http_ratewell_module);
    if (req != NULL || !r->internal) {
        return req;
    }

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_ratewell_cleanup) {
            req = cln->data;
            ngx_http_set_ctx(r, req, ngx_http_ratewell_module);
            return req;
        }
    }

    return NULL;
}


static ngx_int_t
ngx_http_ratewell_handler(ngx_http_request_t *r)
{
    u_char                        *fields, *policy, *p;
    size_t                         cap, policy_len;
    uint64_t                       seconds;
    ngx_str_t                      key;
    ngx_uint_t                     i, n;
    ratewell_ask                  *asks;
    ngx_http_ratewell_ctx_t       *ctx, **asked;
    ngx_http_ratewell_req_t       *req;
    ngx_http_ratewell_limit_t     *limits;
    ngx_pool_cleanup_t            *cln;
    ngx_http_ratewell_loc_conf_t  *lcf;
    ratewell_verdict               verdict;

    if (ngx_http_ratewell_decided(r->main) != NULL) {
        return NGX_DECLINED;
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_ratewell_module);
    if (lcf->limits == NULL || lcf->limits->nelts == 0) {
        return NGX_DECLINED;
    }

    cln = ngx_pool_cleanup_add(r->main->pool, sizeof(ngx_http_ratewell_req_t));
    asks = ngx_palloc(r->pool, lcf->limits->nelts * sizeof(ratewell_ask));
    asked = ngx_palloc(r->pool,
                       lcf->limits->nelts * sizeof(ngx_http_ratewell_ctx_t *));
    if (cln == NULL || asks == NULL || asked == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    req = cln->data;
    req->admitted = 0;
    cln->handler = ngx_http_ratewell_cleanup;
    ngx_http_set_ctx(r->main, req, ngx_http_ratewell_module);

    limits = lcf->limits->elts;
    cap = 0;
    policy_len = 0;
    n = 0;

    for (i = 0; i < lcf->limits->nelts; i++) {
        ctx = limits[i].shm_zone->data;

        if (ctx->zone == NULL) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "ratewell_zone \"%V\" is not open in this worker",
                          &ctx->name);
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ngx_http_complex_value(r, &ctx->key, &key) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        /* As limit_req: a request whose key is empty is not limited by the zone. */
        if (key.len == 0) {
            continue;
        }

        asks[n].zone = ctx->zone;
        asks[n].key = key.data;
        asks[n].key_len = key.len;
        asked[n] = ctx;
        n++;

        /* A field: the name as a string (each byte escaped at most once), then ";r=" and
         * ";t=" with at most 15 digits each, and ", " between fields. */
        cap += 2 * ctx->name.len + 48;
        policy_len += ctx->policy_field.len + 2;
    }

    if (n == 0) {
        req->admitted = 1;
        return NGX_DECLINED;
    }

    fields = ngx_pnalloc(r->pool, cap);
    if (fields == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ratewell_decide(asks, n, 1, fields, cap, &verdict) != 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "ratewell could not decide the request");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (lcf->headers) {
        policy = ngx_pnalloc(r->pool, policy_len);
        if (policy == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        p = policy;
        for (i = 0; i < n; i++) {
            if (i > 0) {
                *p++ = ','; *p++ = ' ';
            }
            p = ngx_cpymem(p, asked[i]->policy_field.data,
                           asked[i]->policy_field.len);
        }

        if (ngx_http_ratewell_add_header(r, &ngx_http_ratewell_policy_name,
                                         policy, p - policy)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (verdict.fields_len <= cap
            && ngx_http_ratewell_add_header(r, &ngx_http_ratewell_field_name,
                                            fields, verdict.fields_len)
               != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    if (verdict.admitted) {
        req->admitted = 1;
        return NGX_DECLINED;
    }

    ctx = asked[verdict.rejected_by < n ? verdict.rejected_by : 0];

    if (verdict.retry_after_ns == RATEWELL_NO_RETRY) {
        ngx_log_error(lcf->log_level, r->connection->log, 0,
                      "limiting requests by ratewell zone \"%V\": "
                      "more than its capacity", &ctx->name);
        return lcf->status;
    }

    seconds = verdict.retry_after_ns / 1000000000
              + (verdict.retry_after_ns % 1000000000 != 0);

    if (verdict.table_full) {
        ngx_log_error(lcf->log_level, r->connection->log, 0,
                      "ratewell zone \"%V\" is full: a new key is refused, "
                      "retry after %uL s", &ctx->name, seconds);

    } else {
        ngx_log_error(lcf->log_level, r->connection->log, 0,
                      "limiting requests by ratewell zone \"%V\", "
                      "retry after %uL s", &ctx->name, seconds);
    }

    if (lcf->headers) {
        p = ngx_pnalloc(r->pool, NGX_INT64_LEN);
        if (p == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ngx_http_ratewell_add_header(r, &ngx_http_ratewell_retry_after,
                                         p, ngx_sprintf(p, "%uL", seconds) - p)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    return lcf->status;
}


static ngx_int_t
ngx_http_ratewell_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_ratewell_ctx_t  *octx = data;

    u_char                    err[NGX_HTTP_RATEWELL_ERR_LEN];
    size_t                    capacity, len;
    ratewell_zone            *zone;
    ngx_slab_pool_t          *shpool;
    ngx_http_ratewell_ctx_t  *ctx;

    ctx = shm_zone->data;
    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (octx) {
        /* A reload that keeps the zone (same name and size): the table is where it was. */
        if (ctx->key.value.len != octx->key.value.len
            || ngx_strncmp(ctx->key.value.data, octx->key.value.data,
                           ctx->key.value.len)
               != 0)
        {
            ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                          "ratewell_zone \"%V\" uses the \"%V\" key "
                          "while previously it used the \"%V\" key",
                          &shm_zone->shm.name, &ctx->key.value,
                          &octx->key.value);
            return NGX_ERROR;
        }

        ctx->sh = octx->sh;

    } else if (shm_zone->shm.exists) {
        ctx->sh = shpool->data;

    } else {
        ctx->sh = ngx_slab_alloc(shpool, sizeof(ngx_http_ratewell_shctx_t));
        if (ctx->sh == NULL) {
            return NGX_ERROR;
        }

        /* The rest of the zone's pages, in one run (a new pool's free pages are contiguous):
         * the largest table that fits. */
        len = 0;
        capacity = ratewell_capacity(ctx->policy.data, ctx->policy.len,
                                     shpool->pfree << ngx_pagesize_shift, &len);
        if (capacity == 0) {
            ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                          "ratewell_zone \"%V\" is too small for its policy "
                          "\"%V\": not one key fits in %uz bytes",
                          &shm_zone->shm.name, &ctx->policy,
                          (size_t) (shpool->pfree << ngx_pagesize_shift));
            return NGX_ERROR;
        }

        ctx->sh->region = ngx_slab_calloc(shpool, len);
        if (ctx->sh->region == NULL) {
            return NGX_ERROR;
        }

        ctx->sh->len = len;
        ctx->sh->capacity = capacity;
        shpool->data = ctx->sh;
    }

    /* The first opening initialises the table; a later one (a reload) checks that the table
     * was made with this policy. The workers open it again after they fork. */
    zone = ratewell_zone_open(ctx->sh->region, ctx->sh->len,
                              ctx->policy.data, ctx->policy.len,
                              ctx->sh->capacity, (int32_t) ctx->refuse,
                              shm_zone->shm.name.data, shm_zone->shm.name.len,
                              err, sizeof(err));
    if (zone == NULL) {
        ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                      "ratewell_zone \"%V\": %s", &shm_zone->shm.name, err);
        return NGX_ERROR;
    }

    ratewell_zone_close(zone);

    return NGX_OK;
}


static void *
ngx_http_ratewell_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_ratewell_main_conf_t  *mcf;

    mcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_ratewell_main_conf_t));
    if (mcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&mcf->zones, cf->pool, 4,
                       sizeof(ngx_http_ratewell_ctx_t *))
        != NGX_OK)
    {
        return NULL;
    }

    return mcf;
}


static void *
ngx_http_ratewell_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_ratewell_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_ratewell_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->limits = NULL;
     */

    conf->status = NGX_CONF_UNSET_UINT;
    conf->log_level = NGX_CONF_UNSET_UINT;
    conf->headers = NGX_CONF_UNSET;

    return conf;
}


static char *
ngx_http_ratewell_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_ratewell_loc_conf_t *prev = parent;
    ngx_http_ratewell_loc_conf_t *conf = child;

    if (conf->limits == NULL) {
        conf->limits = prev->limits;
    }

    ngx_conf_merge_uint_value(conf->status, prev->status,
                              NGX_HTTP_TOO_MANY_REQUESTS);
    ngx_conf_merge_uint_value(conf->log_level, prev->log_level, NGX_LOG_ERR);
    ngx_conf_merge_value(conf->headers, prev->headers, 1);

    return NGX_CONF_OK;
}


/*
 * ratewell_zone KEY zone=NAME:SIZE policy="SPEC" [on_full=refuse|evict]
 *
 * A full zone reclaims the keys whose state is a fresh key's first (nothing is lost); then,
 * by default (on_full=refuse), it refuses a new key rather than forget a limited one;
 * on_full=evict forgets the key whose loss grants least.
 *
 * nginx splits a quoted value inside a word at its spaces (policy="a b" is two words), so the
 * words from one that begins policy=" to the one that ends with a quote are one policy.
 */
static char *
ngx_http_ratewell_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_ratewell_main_conf_t  *mcf = conf;

    u_char                            *p, err[NGX_HTTP_RATEWELL_ERR_LEN];
    size_t                             len;
    ssize_t                            size;
    ngx_str_t                         *value, name, s, policy;
    ngx_uint_t                         i, j, refuse;
    ngx_shm_zone_t                    *shm_zone;
    ngx_http_ratewell_ctx_t           *ctx, **slot;
    ngx_http_compile_complex_value_t   ccv;

    value = cf->args->elts;

    ctx = ngx_pcalloc(cf->pool, sizeof(ngx_http_ratewell_ctx_t));
    if (ctx == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

    ccv.cf = cf;
    ccv.value = &value[1];
    ccv.complex_value = &ctx->key;

    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    size = 0;
    refuse = 1;
    ngx_str_null(&name);
    ngx_str_null(&policy);

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {

            name.data = value[i].data + 5;

            p = (u_char *) ngx_strchr(name.data, ':');

            if (p == NULL) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            name.len = p - name.data;

            s.data = p + 1;
            s.len = value[i].data + value[i].len - s.data;

            size = ngx_parse_size(&s);

            if (size == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            if (size < (ssize_t) (8 * ngx_pagesize)) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "zone \"%V\" is too small", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "policy=", 7) == 0) {

            s.data = value[i].data + 7;
            s.len = value[i].len - 7;

            if (s.len > 0 && s.data[0] == '"') {
                /* The words up to the one that ends the quote, joined by spaces. */
                len = 0;
                for (j = i; j < cf->args->nelts; j++) {
                    len += value[j].len + 1;
                    if (value[j].len > (j == i ? 8 : 0)
                        && value[j].data[value[j].len - 1] == '"')
                    {
                        break;
                    }
                }

                if (j == cf->args->nelts) {
                    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                       "unterminated quote in \"%V\"",
                                       &value[i]);
                    return NGX_CONF_ERROR;
                }

                policy.data = ngx_pnalloc(cf->pool, len);
                if (policy.data == NULL) {
                    return NGX_CONF_ERROR;
                }

                p = ngx_cpymem(policy.data, s.data + 1, s.len - 1);
                for (i++; i <= j; i++) {
                    *p++ = ' ';
                    p = ngx_cpymem(p, value[i].data, value[i].len);
                }
                i--;

                /* Without the closing quote. */
                policy.len = p - policy.data - 1;

            } else {
                policy = s;
            }

            continue;
        }

        if (ngx_strcmp(value[i].data, "on_full=evict") == 0) {
            refuse = 0;
            continue;
        }

        if (ngx_strcmp(value[i].data, "on_full=refuse") == 0) {
            refuse = 1;
            continue;
        }

        if (ngx_strncmp(value[i].data, "rate=", 5) == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\": ratewell_zone takes its limit as "
                               "policy=\"...\"; limit_req's rate=, burst and "
                               "delay are written as policy=\"leaky-bucket "
                               "rate=10r/s burst=5 compat=nginx\"",
                               &value[i]);
            return NGX_CONF_ERROR;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (policy.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"policy\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (ratewell_policy_check(policy.data, policy.len, err, sizeof(err)) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid policy \"%V\" of zone \"%V\": %s",
                           &policy, &name, err);
        return NGX_CONF_ERROR;
    }

    shm_zone = ngx_shared_memory_add(cf, &name, size,
                                     &ngx_http_ratewell_module);
    if (shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (shm_zone->data) {
        ctx = shm_zone->data;

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V \"%V\" is already bound to key \"%V\"",
                           &cmd->name, &name, &ctx->key.value);
        return NGX_CONF_ERROR;
    }

    ctx->name = name;
    ctx->policy = policy;
    ctx->refuse = refuse;
    ctx->shm_zone = shm_zone;

    shm_zone->init = ngx_http_ratewell_init_zone;
    shm_zone->data = ctx;

    slot = ngx_array_push(&mcf->zones);
    if (slot == NULL) {
        return NGX_CONF_ERROR;
    }

    *slot = ctx;

    return NGX_CONF_OK;
}


/* ratewell zone=NAME: every zone named in a location decides its requests, all or nothing. */
static char *
ngx_http_ratewell(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_ratewell_loc_conf_t  *lcf = conf;

    ngx_str_t                  *value, s;
    ngx_uint_t                  i;
    ngx_shm_zone_t             *shm_zone;
    ngx_http_ratewell_limit_t  *limit, *limits;

    value = cf->args->elts;

    shm_zone = NULL;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {

            s.len = value[i].len - 5;
            s.data = value[i].data + 5;

            shm_zone = ngx_shared_memory_add(cf, &s, 0,
                                             &ngx_http_ratewell_module);
            if (shm_zone == NULL) {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "burst=", 6) == 0
            || ngx_strcmp(value[i].data, "nodelay") == 0
            || ngx_strncmp(value[i].data, "delay=", 6) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\": a ratewell zone's burst and delay "
                               "are its policy's (policy=\"leaky-bucket "
                               "rate=10r/s burst=5 nodelay compat=nginx\")",
                               &value[i]);
            return NGX_CONF_ERROR;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (shm_zone == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (lcf->limits == NULL) {
        lcf->limits = ngx_array_create(cf->pool, 1,
                                       sizeof(ngx_http_ratewell_limit_t));
        if (lcf->limits == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    limits = lcf->limits->elts;

    for (i = 0; i < lcf->limits->nelts; i++) {
        if (shm_zone == limits[i].shm_zone) {
            return "is duplicate";
        }
    }

    limit = ngx_array_push(lcf->limits);
    if (limit == NULL) {
        return NGX_CONF_ERROR;
    }

    limit->shm_zone = shm_zone;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_ratewell_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_ratewell_handler;

    return NGX_OK;
}


/* Each worker opens every zone's table for itself (its own counters), after the fork. */
static ngx_int_t
ngx_http_ratewell_init_process(ngx_cycle_t *cycle)
{
    u_char                          err[NGX_HTTP_RATEWELL_ERR_LEN];
    size_t                          len;
    ngx_uint_t                      i;
    ngx_http_ratewell_ctx_t        *ctx, **zones;
    ngx_http_ratewell_main_conf_t  *mcf;

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_ratewell_module);
    if (mcf == NULL) {
        return NGX_OK;
    }

    zones = mcf->zones.elts;

    for (i = 0; i < mcf->zones.nelts; i++) {
        ctx = zones[i];

        if (ctx->sh == NULL) {
            continue;
        }

        ctx->zone = ratewell_zone_open(ctx->sh->region, ctx->sh->len,
                                       ctx->policy.data, ctx->policy.len,
                                       ctx->sh->capacity,
                                       (int32_t) ctx->refuse,
                                       ctx->name.data, ctx->name.len,
                                       err, sizeof(err));
        if (ctx->zone == NULL) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "ratewell_zone \"%V\": %s", &ctx->name, err);
            continue;
        }

        len = ratewell_zone_policy_field(ctx->zone, NULL, 0);
        ctx->policy_field.data = ngx_pnalloc(cycle->pool, len);
        if (ctx->policy_field.data == NULL) {
            return NGX_ERROR;
        }

        ctx->policy_field.len = ratewell_zone_policy_field(ctx->zone,
                                                   ctx->policy_field.data, len);
    }

    return NGX_OK;
}


static void
ngx_http_ratewell_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                      i;
    ngx_http_ratewell_ctx_t       **zones;
    ngx_http_ratewell_main_conf_t  *mcf;

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_ratewell_module);
    if (mcf == NULL) {
        return;
    }

    zones = mcf->zones.elts;

    for (i = 0; i < mcf->zones.nelts; i++) {
        ratewell_zone_close(zones[i]->zone);
        zones[i]->zone = NULL;
    }
}
