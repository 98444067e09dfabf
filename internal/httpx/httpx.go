// Package httpx holds the HTTP rules that more than one of the module's
// packages apply.
package httpx

import "net/http"

// Bodiless reports whether resp, the answer to a request of method, has no
// body to read: none, http.NoBody, or one that HTTP rules out (an answer to
// HEAD; 1xx but 101; 204; 304), which HTTP/2 answers with a Body that is not
// http.NoBody.
func Bodiless(method string, resp *http.Response) bool {
	s := resp.StatusCode
	return resp.Body == nil || resp.Body == http.NoBody || method == http.MethodHead ||
		s == http.StatusNoContent || s == http.StatusNotModified || s/100 == 1 && s != http.StatusSwitchingProtocols
}

// Method returns the method of the request resp answers, if it says.
func Method(resp *http.Response) string {
	if resp.Request == nil {
		return ""
	}
	return resp.Request.Method
}
