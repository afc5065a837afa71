"""Word lists of tools/eval/make_rag_qa.py's fictional world (names, towns, rivers,
industries, devices, background prose), and the generated names that are real words.
Data only; the order of every list is part of the generator's determinism."""

# ----------------------------------------------------------------------------------------
# Word lists
# ----------------------------------------------------------------------------------------

FIRST_F = ["Clara", "Marta", "Elise", "Ingrid", "Helena", "Agnes", "Vera", "Lucia", "Greta",
           "Sofia", "Irene", "Hanna", "Edith", "Mirela", "Theresa", "Karin", "Amalia",
           "Rosa", "Leonie", "Dora", "Freya", "Ottilie", "Beatrix", "Lena", "Cecile",
           "Paula", "Judit", "Annika", "Milena", "Carlotta"]
FIRST_M = ["Elias", "Henrik", "Tomas", "Anton", "Viktor", "Matthias", "Oskar", "Felix",
           "Bruno", "Lukas", "Emil", "Jonas", "Arvid", "Konrad", "Simon", "Pavel", "Gustav",
           "Ludvig", "Jakob", "August", "Milan", "Ferdinand", "Walter", "Stefan", "Rafael",
           "Teodor", "Hugo", "Aurel", "Casimir", "Leopold"]
SUR_HEAD = ["Var", "Oster", "Kel", "Brand", "Hal", "Dra", "Mer", "Tal", "Wen", "Cor", "Lind",
            "Fen", "Gar", "Ash", "Rav", "Sel", "Thorn", "Bel", "Quin", "Mar", "Har", "Els",
            "Tor", "Kas", "Ros", "Dun", "Pem", "Lor", "Hol", "Stra", "Brek", "Vos", "Ul",
            "Rend", "Mol", "Sten", "Ger", "Ald", "Fal", "Wes"]
SUR_TAIL = ["nell", "by", "lam", "oran", "vik", "wood", "mark", "sen", "ing", "hart",
            "strom", "ley", "ford", "gaard", "ick", "ner", "row", "bach", "win", "dahl",
            "quist", "more", "ten", "holt", "ander"]
TOWN_HEAD = ["Tarn", "Brem", "Ost", "Kil", "Ash", "Wend", "Hol", "Mir", "Cal", "Dun",
             "Fel", "Gral", "Lis", "Mor", "Pell", "Quar", "Rath", "Sand", "Tull", "Ulm",
             "Vard", "Wick", "Yar", "Zel", "Elm", "Hark", "Lud", "Nes", "Orm", "Brak",
             "Cran", "Drey", "Glen", "Kess", "Lang", "Marl", "Pen", "Rook", "Sil", "Thal"]
TOWN_TAIL = ["wick", "ford", "holm", "stead", "by", "mouth", "ton", "field", "haven",
             "moor", "dale", "port", "bury", "mere", "crest", "gate", "hurst", "ley",
             "minster", "wold"]
RIVER_HEAD = ["Ald", "Bre", "Cel", "Dor", "Ev", "Fal", "Gwy", "Hel", "Is", "Kel", "Lor",
              "Mer", "Nar", "Or", "Per", "Ran", "Sil", "Tam", "Ur", "Ves", "Wyl", "Ard",
              "Bel", "Cor"]
RIVER_TAIL = ["on", "wen", "ent", "ara", "ine", "ow", "ay", "isk", "ern", "ade", "ola",
              "et"]
ROOT_HEAD = ["Vel", "Cor", "Dra", "Hal", "Ar", "Bel", "Mor", "Kes", "Lum", "Sar", "Tes",
             "Val", "Zor", "Quen", "Ren", "Pol", "Eld", "Gal", "Fen", "Ost", "Cal", "Mar",
             "Ver", "Ul"]
ROOT_TAIL = ["mor", "ane", "vik", "oran", "ith", "ova", "ex", "dren", "ant", "ell", "ura",
             "ine", "ast", "ion", "esk", "ard", "ulon", "emar"]

INDUSTRIES = [
    # name word, products (plural), customers, war product
    ("Instruments", "measuring instruments", "laboratories and surveyors", "range finders"),
    ("Textiles", "woollen cloth and blankets", "tailors and department stores", "uniform cloth"),
    ("Optics", "lenses and field glasses", "opticians and observatories", "periscope lenses"),
    ("Ironworks", "cast iron stoves and railings", "builders and railway companies", "shell casings"),
    ("Glassworks", "bottles and window glass", "breweries and builders", "signal lamps"),
    ("Chemicals", "dyes and soaps", "textile mills and pharmacies", "disinfectants"),
    ("Porcelain", "tableware and vases", "hotels and wealthy households", "insulators"),
    ("Shipping", "cargo and passenger services", "merchants and emigrants", "troop ships"),
    ("Motor Works", "engines and small trucks", "farmers and delivery firms", "army lorries"),
    ("Paper Mills", "writing paper and cardboard", "printers and schools", "ration cards"),
    ("Brewing Company", "lager and dark ale", "inns and grocers", "malt extract"),
    ("Telegraph Company", "telegraph lines and receivers", "post offices and railways", "field telephones"),
    ("Clockworks", "wall clocks and pocket watches", "jewellers and railway stations", "fuse timers"),
    ("Seed Company", "seeds and fertilisers", "farmers and market gardeners", "emergency rations"),
]
LANDMARK_KINDS = [
    # kind, dimension adjective, material
    ("Bridge", "long", "granite"), ("Tower", "tall", "brick"), ("Library", "long", "sandstone"),
    ("Lighthouse", "tall", "limestone"), ("Viaduct", "long", "granite"),
    ("Observatory", "tall", "sandstone"), ("Opera House", "long", "marble"),
    ("Clock Tower", "tall", "brick"), ("Dam", "long", "concrete"),
    ("Town Hall", "long", "limestone"), ("Canal Lock", "long", "granite"),
    ("Water Tower", "tall", "brick"),
]
DEVICES = [
    # device, mechanism, function, users, benefit
    ("pump", "pair of leather pistons", "lift water from deep wells", "farmers",
     "saved hours of work every day"),
    ("loom", "punched wooden cards", "weave patterned cloth", "weavers",
     "halved the time needed for patterned cloth"),
    ("stove", "double-walled iron chamber", "heat a room with little fuel", "households",
     "burned a third less coal"),
    ("barometer", "sealed metal capsule", "measure air pressure", "sailors",
     "gave warning of storms a day in advance"),
    ("printing press", "rotating cylinder", "print both sides of a sheet at once", "printers",
     "doubled the output of a small shop"),
    ("compass", "liquid-filled bowl", "keep the needle steady", "sailors",
     "stayed readable in heavy seas"),
    ("lantern", "glass chimney with an adjustable wick", "give a bright and steady light",
     "miners", "rarely went out in a draught"),
    ("seed drill", "set of rotating cups", "sow seeds in straight rows", "farmers",
     "wasted far less seed"),
    ("sewing machine", "hooked needle and shuttle", "stitch cloth quickly", "tailors",
     "let one worker do the job of five"),
    ("chronometer", "spring balance", "keep exact time at sea", "navigators",
     "made it possible to find longitude reliably"),
    ("calculating machine", "row of stepped drums", "add and multiply large numbers",
     "bookkeepers", "removed most errors from long sums"),
    ("telescope", "folding brass tube", "magnify distant objects", "surveyors",
     "fitted into a coat pocket"),
    ("typewriter", "curved row of type bars", "print letters onto paper", "clerks",
     "produced clean copies far faster than handwriting"),
]
PROFESSIONS_FOUNDER = ["industrialist", "engineer", "merchant", "chemist", "businessman"]
PROFESSIONS_ARCHITECT = ["architect"]
PROFESSIONS_INVENTOR = ["inventor", "engineer", "clockmaker", "mechanic", "instrument maker"]
PROFESSIONS_OTHER = ["painter", "physician", "botanist", "composer", "shipbuilder", "teacher",
                     "journalist", "surveyor", "librarian", "mathematician"]
SUBJECTS = ["mathematics", "chemistry", "drawing", "mechanics", "natural history", "law",
            "medicine", "music", "geometry", "languages"]
TOPICS = ["the strength of timber", "the behaviour of steam", "river currents", "soil quality",
          "the colour of glass", "the timing of tides", "the design of schools",
          "the ventilation of mines", "the pricing of grain", "early photography"]
HOBBIES = ["chess", "beekeeping", "sailing", "gardening", "collecting maps", "fishing",
           "playing the cello", "birdwatching", "bookbinding", "mountain walking"]
QUOTES = ["a good design should explain itself", "patience is the cheapest tool in any workshop",
          "every mistake is a measurement", "the best ideas arrive on long walks",
          "nothing is finished until it is simple", "a tidy bench makes a clear mind"]
MOTTOS = ["Made to last", "Quality before quantity", "Precision in every part",
          "Honest work, fair price", "Steady hands, open minds", "Built for tomorrow"]
SEASONS = ["spring", "summer", "autumn", "winter"]
MONTHS = ["March", "April", "May", "June", "July", "August", "September", "October"]
WEEKDAYS = ["Saturday", "Sunday", "Wednesday", "Friday"]
COUNT_WORDS = ["three", "four", "five", "six", "seven", "eight", "nine", "twelve"]
KNOWN_FOR = ["cheese market", "old salt warehouses", "rose gardens", "boat races",
             "clock makers", "painted doorways", "apple orchards", "lace makers"]
TOWN_INDUSTRY = ["weaving", "tanning", "salt trading", "boat building", "brick making",
                 "brewing", "fishing", "milling", "coal mining", "glass blowing"]
SAINTS = ["Michael", "Nicholas", "Margaret", "Bartholomew", "Gertrude", "Lawrence", "Agatha"]
CENTURIES = ["twelfth", "thirteenth", "fourteenth", "fifteenth"]
ARMS = ["silver fish on a blue field", "golden wheel", "black bear holding a key",
        "red tower between two stars", "green oak tree", "white swan on a red shield"]
FESTIVALS = ["lantern", "harvest", "herring", "flower", "music", "cider"]
CARVINGS = ["ships and sea creatures", "local saints", "farm animals", "the four seasons",
            "famous scientists", "oak leaves and acorns"]
LEGEND_OBJ = ["silver bell", "chest of coins", "lost map", "stone lion", "golden key"]


# Generated names that are real words or well-known names (a model's prior knowledge about
# them would interfere with reading).
BLOCKED = ["marine", "marion", "galant", "renard", "arion", "event", "silent", "below",
           "belay", "evade", "urine", "ardent", "tamara", "celine", "isle", "orient",
           "halley", "marley", "wesley", "ashley", "glendale", "langley", "ashford",
           "wickford", "sandford", "morley", "holby", "marrow", "harrow", "marten"]
