package pacing

// The API key's credential a Transport puts on each request
// (WithCredential).

import "net/http"

// WithCredential sets how a request is given its API key: f is called
// with the outgoing request's headers (a copy) and the id of the key the
// Gate granted from Config.APIKeys, for every request the Transport sends
// but an http.Client's redirect to another host, which goes without it
// and without the caller's own Authorization (net/http's Client sends
// that on to a subdomain): with key "" for one granted no key (no pool, a
// bypass after the longest wait, a request under slots.WithoutSlot),
// which f may send with a key of its choice or none. Without it, requests
// go with the credentials they came with. See BearerKeys.
func WithCredential(f func(h http.Header, key string)) TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.t.credential = f })
}

// BearerKeys returns a credential function for WithCredential that sends
// the secret of each key id as "Authorization: Bearer <secret>", and
// removes the Authorization header for a key without a secret and for a
// request granted no key: a client's own credential never reaches the
// upstream.
func BearerKeys(secrets map[string]string) func(h http.Header, key string) {
	return func(h http.Header, key string) {
		if s := secrets[key]; key != "" && s != "" {
			h.Set("Authorization", "Bearer "+s)
			return
		}
		h.Del("Authorization")
	}
}

// offHost reports whether req is a redirect (made by an http.Client) to
// another host than its first request's: a key's credential is for the
// upstream, and is not sent on to a host it redirects to (as net/http's
// Client does not send a caller's Authorization there).
func offHost(req *http.Request) bool {
	first := req
	for first.Response != nil && first.Response.Request != nil {
		first = first.Response.Request
	}
	return first != req && first.URL.Hostname() != req.URL.Hostname()
}

// credential puts key's credential on req, the Transport's own copy, with
// f; if f panics, req's body is closed first, as a RoundTripper that does
// not send must.
func credential(f func(http.Header, string), req *http.Request, key string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			panic(p)
		}
	}()
	if req.Header == nil {
		// A request built without one (RoundTrip called directly; an
		// http.Client makes one): req is the Transport's own copy, and f
		// must have a Header it can set.
		req.Header = make(http.Header)
	}
	f(req.Header, key)
	return nil
}
