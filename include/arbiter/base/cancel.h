// arbiter/base/cancel.h — cancelling a call from another thread.
//
// A CancelSource belongs to whoever may cancel (the HTTP layer, when the
// client hangs up); the CancelToken it hands out goes down the call. A call
// that only checks between steps asks token.cancelled(); a call that blocks
// registers a callback (OnCancel) that wakes it, so cancellation is seen at
// once instead of by a periodic poll (Note [Slot waits] in
// src/engine/engine.cc is the engine's use of it).
//
// Built on std::stop_source / std::stop_token / std::stop_callback, which
// give exactly the semantics we need: Cancel() runs every registered callback
// once, on the cancelling thread; a callback registered after Cancel() runs
// at once on the registering thread; destroying a registration while its
// callback runs on another thread waits for it to return (so a callback may
// touch the registrant's state until the registration is gone). What this
// wrapper adds: our names, a token that can never fire (the default), a
// movable registration, and Cancellation — a token plus the older CancelFn
// predicate, so callers that only have a predicate keep working.
//
// Usage:
//   CancelSource source;
//   std::thread t([token = source.token()] {
//     Result<SlotReservation> r = engine->ReserveSlot(request, deadline, token);
//     ...
//   });
//   source.Cancel();  // the waiting ReserveSlot returns kCancelled now
//
// Thread safety: thread-safe. Every method of CancelSource, CancelToken and
// Cancellation may be called from any thread (Cancellation::cancelled() runs
// the predicate, which must be safe to call from the calling thread).
// A CancelRegistration is thread-compatible (one owner).
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <stop_token>
#include <type_traits>
#include <utility>

namespace arbiter {

// Polled between tokens and, when a call waits and has no CancelToken,
// while waiting (see Cancellation); true → cancel. Never called under a
// lock of the callee, so it may call back into it.
using CancelFn = std::function<bool()>;

// Keeps a callback registered with a CancelToken; the destructor (or
// Reset()) unregisters it, waiting for it to return if it is running on
// another thread. REQUIRES: not destroyed from inside its own callback's
// caller chain while holding a lock the callback takes (it would wait on
// itself).
class CancelRegistration {
 public:
  CancelRegistration() = default;
  CancelRegistration(CancelRegistration&&) noexcept = default;
  CancelRegistration& operator=(CancelRegistration&&) noexcept = default;
  CancelRegistration(const CancelRegistration&) = delete;
  CancelRegistration& operator=(const CancelRegistration&) = delete;
  ~CancelRegistration() = default;

  void Reset() { callback_.reset(); }

 private:
  friend class CancelToken;
  using Callback = std::stop_callback<std::function<void()>>;
  std::unique_ptr<Callback> callback_;
};

// The receiving end. Cheap to copy (a shared state pointer). A
// default-constructed token is never cancelled.
class CancelToken {
 public:
  CancelToken() = default;

  // True once the source's Cancel() was called.
  bool cancelled() const { return token_.stop_requested(); }
  // False for a default token (nothing can cancel it): a waiter need not
  // register anything.
  bool can_be_cancelled() const { return token_.stop_possible(); }

  // Runs `fn` once when the source is cancelled, on the cancelling thread —
  // or now, on this thread, if it already was. `fn` must not throw and
  // should be short (it runs inside Cancel()). Returns the registration
  // that keeps it; an empty one for a token that can never fire.
  [[nodiscard]] CancelRegistration OnCancel(std::function<void()> fn) const {
    CancelRegistration r;
    if (token_.stop_possible()) {
      r.callback_ = std::make_unique<CancelRegistration::Callback>(token_, std::move(fn));
    }
    return r;
  }

 private:
  friend class CancelSource;
  explicit CancelToken(std::stop_token token) : token_(std::move(token)) {}
  std::stop_token token_;
};

// The cancelling end. Move-only in spirit (copies share the state, as
// std::stop_source does).
class CancelSource {
 public:
  CancelSource() = default;

  CancelToken token() const { return CancelToken(source_.get_token()); }
  // Cancels every token of this source and runs their callbacks (once).
  // Idempotent: a second call does nothing.
  void Cancel() { source_.request_stop(); }
  bool cancelled() const { return source_.stop_requested(); }

 private:
  std::stop_source source_;
};

// What a call watches for cancellation: a CancelToken (a blocked call is
// woken as soon as it fires) and/or a CancelFn predicate (polled: between
// generated tokens, and every kCancelPollMs while a call waits — a
// predicate cannot wake anyone). Converts implicitly from either, and from
// nullptr (never cancelled), so `engine->Generate(req, on_text, nullptr)`,
// `…, cancel_fn)` and `…, source.token())` all work.
class Cancellation {
 public:
  // How often a waiting call polls a predicate-only Cancellation, in
  // milliseconds (the token path does not poll).
  static constexpr int kCancelPollMs = 50;

  Cancellation() = default;
  Cancellation(std::nullptr_t) {}  // NOLINT(google-explicit-constructor)
  Cancellation(CancelToken token)  // NOLINT(google-explicit-constructor)
      : token_(std::move(token)) {}
  // Any callable returning bool (a lambda, a CancelFn; an empty CancelFn is
  // "never").
  template <typename F>
    requires(std::is_invocable_r_v<bool, F&> &&
             !std::is_same_v<std::remove_cvref_t<F>, Cancellation> &&
             !std::is_same_v<std::remove_cvref_t<F>, std::nullptr_t>)
  Cancellation(F&& fn)  // NOLINT(google-explicit-constructor)
      : fn_(std::forward<F>(fn)) {}
  Cancellation(CancelToken token, CancelFn fn) : token_(std::move(token)), fn_(std::move(fn)) {}

  // The token fired, or the predicate returns true. Calls the predicate.
  bool cancelled() const { return token_.cancelled() || (fn_ && fn_()); }
  const CancelToken& token() const { return token_; }
  // True when cancellation can only be seen by polling (a predicate is set).
  bool polls() const { return static_cast<bool>(fn_); }

 private:
  CancelToken token_;
  CancelFn fn_;
};

}  // namespace arbiter
