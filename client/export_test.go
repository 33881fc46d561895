package client

// SetCrashHooks is the crash tests' seam (see hooks): each function, when
// set, runs at its point of every journaled request of c. It exists only
// in this package's test binary: fault hooks are no part of the API.
func SetCrashHooks(c *Client, beforeSend, afterSend, beforeRecord func(body []byte)) {
	c.hooks = &hooks{beforeSend: beforeSend, afterSend: afterSend, beforeRecord: beforeRecord}
}
