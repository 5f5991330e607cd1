// faultproxy: an HTTP-level fault injector between one Kubernetes client (the operator under test)
// and the testbed's API server, for tests/e2e/faults.rs.
//
// Why a proxy of our own next to toxiproxy: toxiproxy works on TCP bytes, and the API server speaks
// TLS, so toxiproxy can delay, throttle, reset or black-hole a connection but never answer one
// request with an HTTP status. The faults a client must survive at the HTTP level are the API
// server's own: 429 with Retry-After (API Priority and Fairness refusing before doing anything),
// 500 (an internal error, sometimes after the write was applied: the answer is lost, not the
// write), and a watch that ends in the middle of its stream.
//
// Why it terminates TLS with a certificate of the testbed's CA: the client keeps verifying its
// server as in production (its kubeconfig only points at another port), and the proxy sees
// requests, not ciphertext.
//
// Why it forwards with the credentials of the kubeconfig it is given (client certificate or
// ServiceAccount token, through client-go's transport): a TLS-terminating proxy cannot pass the
// client's certificate on, and the API server must still see the client's own identity, because
// tests read the audit log to tell who wrote what. Give it the client's own kubeconfig.
//
// Why a plain-HTTP control endpoint on loopback: the test changes the faults while the client runs
// (on during the drains, off at the end) and reads how many it injected, to check the scenario
// really happened.
//
// Streaming responses (watches) pass through unbuffered (FlushInterval -1); each open watch can be
// cut on demand or every few milliseconds, which aborts its response as a broken stream would.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/big"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Faults is what the proxy injects; the control endpoint reads and replaces it as JSON.
type Faults struct {
	// Fraction (0..1) of non-watch requests answered with one of Codes instead of the API
	// server's answer.
	ErrorRate float64 `json:"errorRate"`
	// The statuses to answer with, picked at random: 429 and 500 are supported.
	Codes []int `json:"codes"`
	// Retry-After of a 429, in seconds (the API server sends 1).
	RetryAfterSeconds int `json:"retryAfterSeconds"`
	// Fraction (0..1) of the injected 500s given after forwarding the request: the API server
	// applied it and the client never learns.
	LostAnswerShare float64 `json:"lostAnswerShare"`
	// Only requests of this method (empty: any) whose path matches the regular expression
	// OnlyPathMatching (empty: any) are answered with errors, or held (RequestDelayMs): one kind
	// of write can fail while the rest go through.
	OnlyMethod       string `json:"onlyMethod"`
	OnlyPathMatching string `json:"onlyPathMatching"`
	// Hold every non-watch request that OnlyMethod and OnlyPathMatching select this long before
	// forwarding it (0: at once): one kind of write is slow while the rest go through at once.
	RequestDelayMs int `json:"requestDelayMs"`
	// Cut every open watch this often (0: never).
	CutWatchesEveryMs int `json:"cutWatchesEveryMs"`
	// Every event of a watch opened from now on reaches the client this much later than the API
	// server sent it (0: at once): the client's cache lags, as behind a busy API server.
	WatchDelayMs int `json:"watchDelayMs"`
	// Hold every paged LIST (a GET with a limit parameter, as the watchers' first lists are)
	// this long before forwarding it: a big cluster's slow first sync, while the small calls
	// (leases, single objects, writes) go through at once.
	ListDelayMs int `json:"listDelayMs"`
}

// Stats counts what went through and what was injected since the start.
type Stats struct {
	Requests     uint64            `json:"requests"`
	Watches      uint64            `json:"watches"`
	OpenWatches  int               `json:"openWatches"`
	Injected     map[string]uint64 `json:"injected"`
	LostAnswers  uint64            `json:"lostAnswers"`
	DelayedLists uint64            `json:"delayedLists"`
	WatchesCut   uint64            `json:"watchesCut"`
	UpstreamHost string            `json:"upstreamHost"`
}

type proxy struct {
	reverse *httputil.ReverseProxy
	rng     *mathrand.Rand

	mu        sync.Mutex
	faults    Faults
	onlyPath  *regexp.Regexp // faults.OnlyPathMatching, compiled (nil: any path)
	stats     Stats
	watches   map[uint64]context.CancelFunc
	nextWatch uint64
	nextCut   time.Time
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the client: the API server to forward to and the credentials to use")
	caCert := flag.String("ca-cert", "", "PEM certificate of the CA that signs the serving certificate (the one the client trusts)")
	caKey := flag.String("ca-key", "", "PEM private key of that CA")
	listen := flag.String("listen", "127.0.0.1:0", "address of the TLS proxy")
	control := flag.String("control-listen", "127.0.0.1:0", "address of the plain-HTTP control endpoint")
	addrFile := flag.String("addr-file", "", "file to write 'proxy=PORT' and 'control=PORT' to once both listen")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "seed of the fault choices")
	flag.Parse()
	if *kubeconfig == "" || *caCert == "" || *caKey == "" {
		log.Fatal("--kubeconfig, --ca-cert and --ca-key are required")
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("reading %s: %v", *kubeconfig, err)
	}
	upstream, err := url.Parse(cfg.Host)
	if err != nil {
		log.Fatalf("the server %q of %s is no URL: %v", cfg.Host, *kubeconfig, err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		log.Fatalf("building a transport from %s: %v", *kubeconfig, err)
	}
	serving, err := servingCertificate(*caCert, *caKey)
	if err != nil {
		log.Fatalf("making the serving certificate: %v", err)
	}

	p := &proxy{
		rng:     mathrand.New(mathrand.NewPCG(*seed, *seed^0x9e3779b97f4a7c15)),
		faults:  Faults{Codes: []int{500, 429}, RetryAfterSeconds: 1},
		stats:   Stats{Injected: map[string]uint64{}, UpstreamHost: upstream.Host},
		watches: map[uint64]context.CancelFunc{},
	}
	p.reverse = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(upstream)
			r.Out.Host = upstream.Host
			// The transport adds the kubeconfig's credentials, but only to a request that carries
			// none: the client's own header must not win.
			r.Out.Header.Del("Authorization")
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorLog:      log.New(os.Stderr, "faultproxy upstream: ", log.LstdFlags),
	}

	proxyLn, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listening on %s: %v", *listen, err)
	}
	controlLn, err := net.Listen("tcp", *control)
	if err != nil {
		log.Fatalf("listening on %s: %v", *control, err)
	}
	if *addrFile != "" {
		text := fmt.Sprintf("proxy=%d\ncontrol=%d\n", proxyLn.Addr().(*net.TCPAddr).Port, controlLn.Addr().(*net.TCPAddr).Port)
		// Written whole and renamed, so a reader never sees half of it.
		if err := os.WriteFile(*addrFile+".tmp", []byte(text), 0o644); err != nil {
			log.Fatal(err)
		}
		if err := os.Rename(*addrFile+".tmp", *addrFile); err != nil {
			log.Fatal(err)
		}
	}
	log.Printf("proxying https://%s to %s; control on http://%s", proxyLn.Addr(), cfg.Host, controlLn.Addr())

	go p.cutWatchesPeriodically()
	go func() {
		log.Fatal(http.Serve(controlLn, p.controlHandler()))
	}()
	server := &http.Server{
		Handler:   p,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{serving}, NextProtos: []string{"h2", "http/1.1"}},
		// Aborted watches are expected; keep the log for real trouble.
		ErrorLog: log.New(os.Stderr, "faultproxy: ", log.LstdFlags),
	}
	log.Fatal(server.ServeTLS(proxyLn, "", ""))
}

func isWatch(r *http.Request) bool {
	w := r.URL.Query().Get("watch")
	return w == "true" || w == "1"
}

// verdict is what to do with one non-watch request.
type verdict struct {
	code       int
	lostAnswer bool
}

func (p *proxy) appliesTo(r *http.Request) bool {
	return (p.faults.OnlyMethod == "" || r.Method == p.faults.OnlyMethod) &&
		(p.onlyPath == nil || p.onlyPath.MatchString(r.URL.Path))
}

func (p *proxy) decide(r *http.Request) verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Requests++
	f := p.faults
	if f.ErrorRate <= 0 || len(f.Codes) == 0 || !p.appliesTo(r) || p.rng.Float64() >= f.ErrorRate {
		return verdict{}
	}
	code := f.Codes[p.rng.IntN(len(f.Codes))]
	lost := code == http.StatusInternalServerError && p.rng.Float64() < f.LostAnswerShare
	p.stats.Injected[strconv.Itoa(code)]++
	if lost {
		p.stats.LostAnswers++
	}
	return verdict{code: code, lostAnswer: lost}
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if isWatch(r) {
		p.serveWatch(w, r)
		return
	}
	if delay := p.listDelay(r) + p.requestDelay(r); delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	v := p.decide(r)
	switch {
	case v.code == 0:
		p.reverse.ServeHTTP(w, r)
	case v.lostAnswer:
		// The API server does the work; its answer goes nowhere.
		p.reverse.ServeHTTP(&discard{header: http.Header{}}, r)
		writeStatus(w, v.code, p.retryAfter())
	default:
		writeStatus(w, v.code, p.retryAfter())
	}
}

// listDelay is how long to hold r: ListDelayMs for a paged LIST, else nothing.
func (p *proxy) listDelay(r *http.Request) time.Duration {
	if r.Method != http.MethodGet || !r.URL.Query().Has("limit") {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.faults.ListDelayMs <= 0 {
		return 0
	}
	p.stats.DelayedLists++
	return time.Duration(p.faults.ListDelayMs) * time.Millisecond
}

// requestDelay is how long to hold r: RequestDelayMs if the filters select it, else nothing.
func (p *proxy) requestDelay(r *http.Request) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.faults.RequestDelayMs <= 0 || !p.appliesTo(r) {
		return 0
	}
	return time.Duration(p.faults.RequestDelayMs) * time.Millisecond
}

func (p *proxy) retryAfter() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.faults.RetryAfterSeconds, 1)
}

func (p *proxy) serveWatch(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	p.mu.Lock()
	id := p.nextWatch
	p.nextWatch++
	p.watches[id] = cancel
	p.stats.Watches++
	delay := time.Duration(p.faults.WatchDelayMs) * time.Millisecond
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.watches, id)
		p.mu.Unlock()
		cancel()
	}()
	if delay > 0 {
		delayed := newDelayedWriter(ctx, w, delay)
		defer delayed.close()
		w = delayed
	}
	// A cut makes the copy fail; ReverseProxy then aborts the response (http.ErrAbortHandler),
	// which the client sees as a broken stream (HTTP/2 stream reset or a closed connection).
	p.reverse.ServeHTTP(w, r.WithContext(ctx))
}

// delayedWriter passes a watch's bytes on `delay` after they came, each chunk at its own time
// (a constant lag, not a backlog that grows with the events), flushing each.
type delayedWriter struct {
	http.ResponseWriter
	delay  time.Duration
	chunks chan delayedChunk
	done   chan struct{}
}

type delayedChunk struct {
	due  time.Time
	data []byte
}

func newDelayedWriter(ctx context.Context, w http.ResponseWriter, delay time.Duration) *delayedWriter {
	d := &delayedWriter{ResponseWriter: w, delay: delay, chunks: make(chan delayedChunk, 4096), done: make(chan struct{})}
	flush := http.NewResponseController(w)
	go func() {
		defer close(d.done)
		for c := range d.chunks {
			select {
			case <-time.After(time.Until(c.due)):
			case <-ctx.Done():
				return
			}
			if _, err := w.Write(c.data); err != nil {
				return
			}
			_ = flush.Flush()
		}
	}()
	return d
}

func (d *delayedWriter) Write(b []byte) (int, error) {
	d.chunks <- delayedChunk{due: time.Now().Add(d.delay), data: append([]byte(nil), b...)}
	return len(b), nil
}

// Flush is the writer goroutine's, after each chunk.
func (d *delayedWriter) Flush() {}

// close waits until every chunk is passed on (or the watch is cut).
func (d *delayedWriter) close() {
	close(d.chunks)
	<-d.done
}

func (p *proxy) cutWatches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.watches)
	for id, cancel := range p.watches {
		cancel()
		delete(p.watches, id)
	}
	p.stats.WatchesCut += uint64(n)
	return n
}

func (p *proxy) cutWatchesPeriodically() {
	for range time.Tick(50 * time.Millisecond) {
		p.mu.Lock()
		every := time.Duration(p.faults.CutWatchesEveryMs) * time.Millisecond
		due := every > 0 && !time.Now().Before(p.nextCut)
		if due {
			p.nextCut = time.Now().Add(every)
		}
		p.mu.Unlock()
		if due {
			p.cutWatches()
		}
	}
}

// writeStatus answers as the API server does: a v1 Status, and Retry-After with a 429.
func writeStatus(w http.ResponseWriter, code int, retryAfter int) {
	status := map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "code": code,
	}
	switch code {
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
		status["reason"] = "TooManyRequests"
		status["message"] = "Too many requests, please try again later."
		status["details"] = map[string]any{"retryAfterSeconds": retryAfter}
	default:
		status["reason"] = "InternalError"
		status["message"] = "Internal error occurred: injected by faultproxy"
		status["details"] = map[string]any{"causes": []any{map[string]any{"message": "injected by faultproxy"}}}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(status)
}

// discard swallows the API server's answer of a request whose answer is "lost".
type discard struct{ header http.Header }

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

func (p *proxy) controlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		f := p.faults
		p.mu.Unlock()
		writeJSON(w, f)
	})
	mux.HandleFunc("PUT /faults", func(w http.ResponseWriter, r *http.Request) {
		var f Faults
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			http.Error(w, "faults: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := f.validate(); err != nil {
			http.Error(w, "faults: "+err.Error(), http.StatusBadRequest)
			return
		}
		var onlyPath *regexp.Regexp
		if f.OnlyPathMatching != "" {
			var err error
			if onlyPath, err = regexp.Compile(f.OnlyPathMatching); err != nil {
				http.Error(w, "faults: onlyPathMatching: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		p.mu.Lock()
		p.faults = f
		p.onlyPath = onlyPath
		p.nextCut = time.Now().Add(time.Duration(f.CutWatchesEveryMs) * time.Millisecond)
		p.mu.Unlock()
		writeJSON(w, f)
	})
	mux.HandleFunc("POST /cut-watches", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]int{"cut": p.cutWatches()})
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		s := p.stats
		s.OpenWatches = len(p.watches)
		s.Injected = map[string]uint64{}
		for k, v := range p.stats.Injected {
			s.Injected[k] = v
		}
		p.mu.Unlock()
		writeJSON(w, s)
	})
	return mux
}

func (f Faults) validate() error {
	if f.ErrorRate < 0 || f.ErrorRate > 1 || f.LostAnswerShare < 0 || f.LostAnswerShare > 1 {
		return errors.New("errorRate and lostAnswerShare are fractions between 0 and 1")
	}
	for _, c := range f.Codes {
		if c != http.StatusTooManyRequests && c != http.StatusInternalServerError {
			return fmt.Errorf("code %d: only 429 and 500 are injected", c)
		}
	}
	if f.CutWatchesEveryMs < 0 || f.RetryAfterSeconds < 0 || f.ListDelayMs < 0 || f.WatchDelayMs < 0 {
		return errors.New("cutWatchesEveryMs, retryAfterSeconds, listDelayMs and watchDelayMs cannot be negative")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// servingCertificate makes a fresh key and a certificate for 127.0.0.1 and localhost, signed by
// the given CA.
func servingCertificate(caCertPath, caKeyPath string) (tls.Certificate, error) {
	caPEM, err := os.ReadFile(caCertPath)
	if err != nil {
		return tls.Certificate{}, err
	}
	block, _ := pem.Decode(caPEM)
	if block == nil {
		return tls.Certificate{}, fmt.Errorf("%s holds no PEM certificate", caCertPath)
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", caCertPath, err)
	}
	keyPEM, err := os.ReadFile(caKeyPath)
	if err != nil {
		return tls.Certificate{}, err
	}
	block, _ = pem.Decode(keyPEM)
	if block == nil {
		return tls.Certificate{}, fmt.Errorf("%s holds no PEM key", caKeyPath)
	}
	caKey, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		if ec, ecErr := x509.ParseECPrivateKey(block.Bytes); ecErr == nil {
			caKey = ec
		} else {
			return tls.Certificate{}, fmt.Errorf("%s: %w", caKeyPath, err)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "faultproxy"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
