package auth

import (
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// retryAfterKey is the trailer (gRPC) and header (HTTP) saying how many
// seconds a rate-limited caller should wait.
const retryAfterKey = "retry-after"

// authenticate returns the principal of an Authorization value "Bearer
// <key>" and counts the call against the key's rate. The error is a status:
// Unauthenticated, Unavailable, or ResourceExhausted with the seconds to
// wait in retryAfter.
func (g *Guard) authenticate(ctx context.Context, authorization string) (p Principal, retryAfter int, err error) {
	if g.off {
		return anonymous, 0, nil
	}
	p, err = g.authn.authenticate(ctx, bearerToken(authorization))
	if err != nil {
		return Principal{}, 0, err
	}
	if ok, wait := g.limits.allow(p); !ok {
		return Principal{}, retryAfterSeconds(wait), status.Errorf(codes.ResourceExhausted, "key %s is over its rate of %g calls/s", p.KeyID, g.limits.rates[p.Role])
	}
	return p, 0, nil
}

// bearerToken is the token of an Authorization value "Bearer <token>".
func bearerToken(authorization string) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// incomingAuthorization is the authorization metadata of a gRPC call.
func incomingAuthorization(ctx context.Context) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// IncomingBearer is the bearer token of a gRPC call's authorization
// metadata, "" when there is none.
func IncomingBearer(ctx context.Context) string {
	return bearerToken(incomingAuthorization(ctx))
}

// authorizeCall checks that p may call fullMethod with req, whose
// namespace field the method's rule names.
func (g *Guard) authorizeCall(p Principal, fullMethod string, req any) error {
	rule, ok := rules[fullMethod]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s has no permission rule", fullMethod)
	}
	return rule.allow(p, fullMethod, rule.namespaceOf(req))
}

// grpcPrincipal authenticates a gRPC call from its metadata, setting the
// retry-after trailer when the key is over its rate.
func (g *Guard) grpcPrincipal(ctx context.Context) (Principal, error) {
	p, retryAfter, err := g.authenticate(ctx, incomingAuthorization(ctx))
	if retryAfter > 0 {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(retryAfterKey, strconv.Itoa(retryAfter)))
	}
	return p, err
}

// UnaryInterceptor checks every unary call: the key, its rate, and the
// method's rule against the request's namespace.
func (g *Guard) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, err := g.grpcPrincipal(ctx)
		if err != nil {
			return nil, err
		}
		if err := g.authorizeCall(p, info.FullMethod, req); err != nil {
			return nil, err
		}
		return handler(WithPrincipal(ctx, p), req)
	}
}

// StreamInterceptor checks the opening of every stream: the key, its rate
// and the method's role. A stream's namespace arrives in its messages, so
// the handler checks it with Check.
func (g *Guard) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := g.grpcPrincipal(ss.Context())
		if err != nil {
			return err
		}
		if err := g.authorizeStream(p, info.FullMethod); err != nil {
			return err
		}
		return handler(srv, &principalStream{ServerStream: ss, ctx: WithPrincipal(ss.Context(), p)})
	}
}

// authorizeStream checks that p's role may open fullMethod. The namespace
// is the handler's to check (with Check) once the first message names it,
// so here it is taken to be the key's own.
func (g *Guard) authorizeStream(p Principal, fullMethod string) error {
	rule, ok := rules[fullMethod]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s has no permission rule", fullMethod)
	}
	return rule.allow(p, fullMethod, p.Namespace)
}

// principalStream is a stream whose context carries the principal.
type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }

// HTTP authenticates every request except the health probes, limits its
// rate and requires JSON bodies on writes, so that a cross-site form post
// cannot reach a handler. Authorization happens later, in REST, once
// grpc-gateway has matched the route.
func (g *Guard) HTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz") {
			next.ServeHTTP(w, r)
			return
		}
		p, retryAfter, err := g.authenticate(r.Context(), r.Header.Get("Authorization"))
		if err != nil {
			if retryAfter > 0 {
				w.Header().Set(retryAfterKey, strconv.Itoa(retryAfter))
			}
			writeError(w, err)
			return
		}
		if hasBody(r) && !isJSON(r.Header.Get("Content-Type")) {
			writeStatus(w, http.StatusUnsupportedMediaType, status.New(codes.InvalidArgument, "request body must be Content-Type: application/json"))
			return
		}
		next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
	})
}

// REST authorizes a REST call once grpc-gateway has matched its route: the
// route's gRPC method's rule, with the namespace from the path.
func (g *Guard) REST() runtime.Middleware {
	return func(next runtime.HandlerFunc) runtime.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
			if err := g.authorizeRoute(r, params); err != nil {
				writeError(w, err)
				return
			}
			next(w, r, params)
		}
	}
}

func (g *Guard) authorizeRoute(r *http.Request, params map[string]string) error {
	p, ok := FromContext(r.Context())
	if !ok {
		return status.Error(codes.Unauthenticated, "no authenticated caller")
	}
	pat, ok := runtime.HTTPPattern(r.Context())
	if !ok {
		return status.Error(codes.PermissionDenied, "unmatched route")
	}
	op, ok := g.routes[routeOf(r.Method, pat.String())]
	method := op.fullMethod
	if !ok {
		return status.Errorf(codes.PermissionDenied, "route %s %s has no permission rule", r.Method, pat)
	}
	rule, ok := rules[method]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s has no permission rule", method)
	}
	return rule.allow(p, method, params[rule.NamespaceField])
}

func hasBody(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
	}
	return false
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// writeError writes a status as grpc-gateway writes errors, {code, message,
// details}, with the HTTP status of its code.
func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	if st.Code() == codes.Unauthenticated {
		w.Header().Set("WWW-Authenticate", `Bearer realm="flo"`)
	}
	writeStatus(w, runtime.HTTPStatusFromCode(st.Code()), st)
}

func writeStatus(w http.ResponseWriter, httpStatus int, st *status.Status) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(httpStatus)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Details []any  `json:"details"`
	}{int(st.Code()), st.Message(), []any{}})
}
