// ApiServerController: the window's "Serve the OpenAI API" switch and its address, kept in the
// settings table, and what the worker reports back — the state, the URL, a bind error — plus
// the server's requests for the sidebar. GUI thread only; the worker runs the server.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>

#include "api_request_list_model.h"
#include "chat_store.h"
#include "error_reporter.h"
#include "worker_types.h"

namespace granule::app {

class ApiServerController : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Created by the application")
  // The switch (off by default) and the address; changing one while on restarts the server.
  Q_PROPERTY(bool enabled READ enabled WRITE setEnabled NOTIFY settingsChanged)
  Q_PROPERTY(QString host READ host WRITE setHost NOTIFY settingsChanged)
  Q_PROPERTY(int port READ port WRITE setPort NOTIFY settingsChanged)
  // "": no key needed; else clients send "Authorization: Bearer KEY".
  Q_PROPERTY(QString apiKey READ apiKey WRITE setApiKey NOTIFY settingsChanged)
  // "" when the key is in the system keychain (or there is none); else why it is kept for
  // this session only. The key is never written to the settings in plain text.
  Q_PROPERTY(QString apiKeyNote READ apiKeyNote NOTIFY settingsChanged)
  // The host is not a loopback address: other machines can reach the model.
  Q_PROPERTY(bool hostExposed READ hostExposed NOTIFY settingsChanged)
  Q_PROPERTY(State state READ state NOTIFY statusChanged)
  // "http://127.0.0.1:8080" while serving (the port bound), else "".
  Q_PROPERTY(QString url READ url NOTIFY statusChanged)
  Q_PROPERTY(QString error READ error NOTIFY statusChanged)
  // One line for the window: "Serving on http://127.0.0.1:8080 — 2 requests running".
  Q_PROPERTY(QString statusText READ statusText NOTIFY statusChanged)
  Q_PROPERTY(int runningRequests READ runningRequests NOTIFY statusChanged)
  Q_PROPERTY(granule::app::ApiRequestListModel* requests READ requests CONSTANT)

 public:
  // Starting: asked, no answer from the worker yet. Waiting: on, no model loaded.
  enum class State { Off, Starting, Waiting, Serving, Failed };
  Q_ENUM(State)

  ApiServerController(ChatStore& store, ErrorReporter& errors, QObject* parent = nullptr);

  bool enabled() const { return settings_.enabled; }
  void setEnabled(bool enabled);
  QString host() const { return settings_.host; }
  void setHost(const QString& host);
  int port() const { return settings_.port; }
  void setPort(int port);
  QString apiKey() const { return settings_.api_key; }
  void setApiKey(const QString& key);
  QString apiKeyNote() const { return key_note_; }
  // The key is being read from the keychain; a server left on starts once it is known.
  bool keyLoading() const { return key_loading_; }
  bool hostExposed() const;
  const ServeSettings& settings() const { return settings_; }

  State state() const { return state_; }
  QString url() const;
  QString error() const { return status_.error; }
  QString statusText() const;
  int runningRequests() const { return requests_.count(); }
  ApiRequestListModel* requests() { return &requests_; }

  // Sends the settings to the worker (servingRequested), as at start.
  void apply();

 public Q_SLOTS:
  void onServingChanged(const granule::app::ServingStatus& status);
  void onTelemetry(const granule::app::TelemetryFrame& frame);

 Q_SIGNALS:
  void settingsChanged();
  void statusChanged();
  void servingRequested(const granule::app::ServeSettings& settings);

 private:
  void changed(bool restart);
  // The API key lives in the system keychain (QtKeychain) when the build has it.
  void readKeyFromKeychain();
  void storeKey(const QString& key);

  ChatStore& store_;
  ErrorReporter& errors_;
  ServeSettings settings_;
  ServingStatus status_;
  State state_ = State::Off;
  ApiRequestListModel requests_;
  bool key_loading_ = false;
  bool apply_pending_ = false;
  QString key_note_;
};

}  // namespace granule::app
